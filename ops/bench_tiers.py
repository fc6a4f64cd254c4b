"""`kvferry bench tiers`: what the Redis tier and cache-aware routing buy, side by side in one run.

1. Resume: a 2,048-token session continued on an engine that never saw it, loading its blocks
   from Redis, against recomputing them; then the same at other lengths, to find where loading
   stops paying (below some length, recomputing is cheaper than the round trips).
2. Multi-turn workload through the whole stack (2 workers): sessions sharing system prompts, each
   turn resending the history. Prefix hit rate and p50 TTFT with cache-aware routing, with
   round-robin routing, and with round-robin and no Redis tier.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import redis
import torch

from broker.sampling import SamplingParams
from kvstore.redis_tier import RedisTier
from ops.redis_server import RedisServer, free_port
from ops.settings import Settings
from ops.stack import Stack
from workers.engine.config import EngineConfig
from workers.engine.llm_engine import LLMEngine
from workers.engine.model_loader import LoadedModel, load_model
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


QUESTIONS = (
    "Tell me more.",
    "Why is that?",
    "Give an example.",
    "Summarise it.",
    "What else?",
    "And then?",
    "Explain simply.",
    "Is that always true?",
)


async def _session(
    client: httpx.AsyncClient,
    model: str,
    system: str,
    sid: str,
    turns: int,
    max_tokens: int,
    rng: random.Random,
    rows: list[dict[str, Any]],
) -> None:
    messages = [{"role": "system", "content": system}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"{rng.choice(QUESTIONS)} (#{sid}.{turn})"})
        body = {
            "model": model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "session_id": sid,
        }
        started = time.perf_counter()
        ttft, text = float("nan"), []
        usage: dict[str, Any] = {}
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
                    if ttft != ttft:
                        ttft = time.perf_counter() - started
                    text.append(chunk["choices"][0]["delta"]["content"])
                usage = chunk.get("usage") or usage
        messages.append({"role": "assistant", "content": "".join(text)})
        rows.append(
            {
                "turn": turn,
                "ttft_s": ttft,
                "prompt": usage.get("prompt_tokens", 0),
                "cached": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
                "sources": usage.get("kv_sources", {}),
            }
        )


def _workload(
    settings: Settings,
    routing: str,
    redis_cache: str,
    sessions: int,
    turns: int,
    max_tokens: int,
    run_dir: Path,
) -> dict[str, Any]:
    stack_settings = settings.with_overrides(
        routing=routing, redis_cache_size=redis_cache, api_port=free_port(), torch_threads=1
    )
    # Four system prompts of ~300 tokens (production ones are often longer), shared by the sessions.
    systems = [
        f"You are assistant number {i}. " + "Answer carefully, briefly and politely. " * 40 for i in range(4)
    ]
    rows: list[dict[str, Any]] = []
    with Stack(stack_settings, 2, run_dir=run_dir, with_flower=False) as stack:
        stack.wait_ready()

        async def run() -> None:
            async with httpx.AsyncClient(base_url=stack.api_url, timeout=600) as client:
                await asyncio.gather(
                    *(
                        _session(
                            client,
                            settings.served_model,
                            systems[i % 4],
                            f"s{i}-{routing}-{redis_cache}",
                            turns,
                            max_tokens,
                            random.Random(i),
                            rows,
                        )
                        for i in range(sessions)
                    )
                )

        started = time.perf_counter()
        asyncio.run(run())
        wall = time.perf_counter() - started
    later = [r for r in rows if r["turn"] > 0]
    ttfts = sorted(r["ttft_s"] for r in rows if r["ttft_s"] == r["ttft_s"])
    return {
        "routing": routing,
        "redis_tier": redis_cache != "0",
        "requests": len(rows),
        "wall_s": wall,
        "hit_rate": sum(r["cached"] for r in rows) / max(1, sum(r["prompt"] for r in rows)),
        "hit_rate_after_first_turn": sum(r["cached"] for r in later)
        / max(1, sum(r["prompt"] for r in later)),
        "ttft_p50_s": ttfts[len(ttfts) // 2] if ttfts else float("nan"),
        "ttft_mean_s": statistics.fmean(ttfts) if ttfts else float("nan"),
        "redis_tokens": sum(r["sources"].get("redis", 0) for r in rows),
    }


def run_tier_bench(settings: Settings, quick: bool, skip: set[str]) -> dict[str, Any]:
    results: dict[str, Any] = {"model": settings.served_model, "quick": quick}
    with tempfile.TemporaryDirectory(prefix="kvferry-tiers-") as tmp:
        run_dir = Path(tmp)
        if "resume" not in skip:
            loaded = load_model(settings.model, settings.dtype, settings.device, settings.cache_dir)
            lengths = [64, 256, 1024] if quick else [16, 32, 64, 128, 256, 512, 1024, 2048]
            results["resume"] = bench_resume(settings, loaded, lengths, run_dir / "resume")
            results["resume_ratio_2048"] = results["resume"]["resume_ratio_2048"]
            del loaded
        if "workload" not in skip:
            sessions, turns = (16, 4) if quick else (64, 6)
            configs = [
                ("cache-aware", settings.redis_cache_size),
                ("round-robin", settings.redis_cache_size),
                ("round-robin", "0"),
            ]
            results["workload"] = [
                _workload(settings, routing, cache, sessions, turns, 16, run_dir / f"w{i}")
                for i, (routing, cache) in enumerate(configs)
            ]
    rows = [("measure", "value")]
    if "resume" in results:
        r = results["resume"]
        rows.append(
            ("resume 2,048-token session: Redis vs recompute (time ratio)", f"{r['resume_ratio_2048']:.3f}")
        )
        rows.append(("loading pays from (history tokens)", str(r["loading_pays_from_tokens"])))
    for w in results.get("workload", []):
        label = f"{w['routing']}{'' if w['redis_tier'] else ', no Redis tier'}"
        rows.append(
            (
                f"workload hit rate / p50 TTFT ({label})",
                f"{w['hit_rate']:.1%} / {w['ttft_p50_s'] * 1000:.0f} ms",
            )
        )
    width = max(len(a) for a, _ in rows)
    print("\n".join(f"{a.ljust(width)}  {b}" for a, b in rows), flush=True)
    return results
