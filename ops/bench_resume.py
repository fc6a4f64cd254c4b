"""Resume: a session continued on an engine that never saw it, loading its blocks from Redis,
against recomputing them, at several history lengths (part of `kvferry bench tiers`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import redis
import torch

from broker.sampling import SamplingParams
from kvstore.redis_tier import RedisTier
from ops.redis_server import RedisServer
from ops.settings import Settings
from workers.engine.config import EngineConfig
from workers.engine.llm_engine import LLMEngine
from workers.engine.model_loader import LoadedModel
from workers.kv_writer import KVWriter
from workers.prefetch import prefetch

TAIL = 16  # new tokens of the resumed turn


def _engine(config: EngineConfig, loaded: LoadedModel) -> LLMEngine:
    return LLMEngine(config, loaded)


def _ttft(engine: LLMEngine, prompt: list[int]) -> float:
    started = time.perf_counter()
    engine.generate([prompt], SamplingParams(max_tokens=1, ignore_eos=True))
    return time.perf_counter() - started


def bench_resume(
    settings: Settings, loaded: LoadedModel, lengths: list[int], run_dir: Path
) -> dict[str, Any]:
    config = settings.engine_config()
    vocab = int(loaded.model.config.vocab_size)
    rng = torch.Generator().manual_seed(5)
    rows = []
    with RedisServer(run_dir / "redis") as server:
        client = redis.Redis.from_url(server.url)
        for length in lengths:
            history = torch.randint(100, vocab, (length,), generator=rng).tolist()
            turn = history + torch.randint(100, vocab, (TAIL,), generator=rng).tolist()
            writer_engine = _engine(config, loaded)  # the worker that served the session so far
            tier = RedisTier(client, writer_engine.kv_format, 8 * 1024**3)
            writer = KVWriter(tier)
            assert writer_engine.tiers is not None
            writer_engine.tiers.cold_sink = writer.enqueue
            writer_engine.generate([[*history, history[-1]]], SamplingParams(max_tokens=1, ignore_eos=True))
            writer.flush(120)
            writer.stop()
            del writer_engine

            fresh = _engine(config, loaded)  # another worker: nothing of this session local
            _ttft(fresh, [7, 8, 9])  # first-forward warm-up, outside the timing
            started = time.perf_counter()
            fetched = prefetch(fresh, tier, turn, "")
            fetch_s = time.perf_counter() - started
            out_ttft = _ttft(fresh, turn)
            loaded_s = fetch_s + out_ttft
            del fresh

            cold = _engine(config, loaded)
            _ttft(cold, [7, 8, 9])
            recompute_s = _ttft(cold, turn)
            del cold
            tier.clear()
            rows.append(
                {
                    "history_tokens": length,
                    "blocks_fetched": fetched,
                    "fetch_s": fetch_s,
                    "prefill_after_fetch_s": out_ttft,
                    "resume_from_redis_s": loaded_s,
                    "recompute_s": recompute_s,
                    "ratio": loaded_s / recompute_s,
                }
            )
            print(
                f"  resume {length:>5} tokens: redis {loaded_s * 1000:7.1f} ms (fetch {fetch_s * 1000:6.1f}) "
                f"vs recompute {recompute_s * 1000:7.1f} ms -> {loaded_s / recompute_s:.2f}",
                flush=True,
            )
    paying = [r["history_tokens"] for r in rows if r["ratio"] < 1.0]
    longest = max(rows, key=lambda r: r["history_tokens"])
    return {
        "rows": rows,
        "resume_ratio_2048": next(
            (r["ratio"] for r in rows if r["history_tokens"] == 2048), longest["ratio"]
        ),
        "loading_pays_from_tokens": min(paying) if paying else None,
    }
