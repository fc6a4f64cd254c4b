"""Resume: a session continued on an engine that never saw it, loading its blocks from Redis,
against recomputing them, at several history lengths (part of `kvferry bench tiers`)."""

from __future__ import annotations

import gc
import resource
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import redis
import torch

from broker.sampling import SamplingParams
from kvstore.chain import chain
from kvstore.pool.kv_cache import KVCache
from kvstore.redis import fetch as tier_fetch
from kvstore.redis.tier import RedisTier
from kvstore.tiers import codec
from ops.bench.engine.target import EngineTarget
from ops.bench.tiers.resume_figures import FULL_LENGTH, summary
from ops.redis.server import RedisServer
from ops.settings import Settings
from workers.engine.config import EngineConfig
from workers.engine.factory import build_engine
from workers.engine.llm_engine import LLMEngine
from workers.engine.model.loader import LoadedModel
from workers.tiers.prefetch import prefetch
from workers.tiers.writer import KVWriter

TAIL = 16  # new tokens of the resumed turn


def _engine(config: EngineConfig, loaded: LoadedModel) -> LLMEngine:
    return build_engine(config, loaded)


def _ttft(engine: LLMEngine, prompt: list[int]) -> float:
    started = time.perf_counter()
    engine.generate([prompt], SamplingParams(max_tokens=1, ignore_eos=True))
    return time.perf_counter() - started


def _timed_writes(engine: LLMEngine) -> list[float]:
    """Seconds the engine spends copying loaded blocks into its pool (Redis -> pool's last stage)."""
    spent = [0.0]
    inner: Callable[[Any], None] = engine.executor.kv_cache.write_blocks

    def write_blocks(loads: Any) -> None:
        started = time.perf_counter()
        inner(loads)
        spent[0] += time.perf_counter() - started

    engine.executor.kv_cache.write_blocks = write_blocks  # type: ignore[method-assign]
    return spent


def raw_mgets(
    client: redis.Redis, chunks: list[Sequence[bytes]], in_flight: int
) -> tuple[list[bytes], float]:
    """Plain redis-py MGETs of `chunks`, `in_flight` of them at a time, each on a thread and a
    connection of its own (as the tier's fetch keeps AHEAD on the wire): the values in order, and
    the seconds they took."""
    started = time.perf_counter()
    with ThreadPoolExecutor(in_flight, thread_name_prefix="bench-raw-mget") as pool:
        replies = list(pool.map(client.mget, chunks))
    return [cast("bytes", v) for reply in replies for v in reply], time.perf_counter() - started


def _stages(tier: RedisTier, hashes: list[bytes], pool: KVCache) -> dict[str, float]:
    """MB/s of each stage of the read path, apart: network + parse (plain redis-py MGETs, the
    baseline: one at a time, and as many in flight on as many connections as the tier's fetch),
    the same MGETs received straight into buffers (bulk_mget, what the tier uses), checksums,
    decode (header, views, checksums, dequantising), the copy into the pool; and get_run as it
    overlaps them. The MGETs are the tier's: its packs in its chunks (kvstore/redis/fetch.py)."""
    keys = list(dict.fromkeys(cast("list[bytes]", tier.client.hmget(tier.keys.index, hashes))))
    chunks = tier_fetch.batched(keys, max(1, tier_fetch._MAX_MGET_BYTES // tier.fetcher.pack_bytes))
    client = cast("redis.Redis", tier.client)  # the bench's own plain Redis
    raw_mgets(client, chunks, tier_fetch.AHEAD)  # untimed: the connections opened for both
    values, net_s = raw_mgets(client, chunks, 1)
    concurrent, concurrent_s = raw_mgets(client, chunks, tier_fetch.AHEAD)
    assert concurrent == values
    started = time.perf_counter()
    direct = [v for chunk in chunks for v in tier.fetcher.mget(chunk)]
    direct_s = time.perf_counter() - started
    assert [bytes(v) if v is not None else None for v in direct] == values
    size = sum(len(v) for v in values)
    started = time.perf_counter()
    decoded = [codec.decode_pack(tier.fmt, v, tier.tier_dtype) for v in values]
    decode_s = time.perf_counter() - started
    started = time.perf_counter()
    for v in values:
        codec.block_checksum(b"", b"", b"", v)
    checksum_s = time.perf_counter() - started
    blocks = [b for d in decoded for b in d.blocks]
    started = time.perf_counter()
    pool.write_blocks([(i, block.kv) for i, block in enumerate(blocks[: pool.num_blocks])])
    copy_s = time.perf_counter() - started
    started = time.perf_counter()
    tier.get_run(hashes)
    run_s = time.perf_counter() - started
    pool_bytes = len(blocks[: pool.num_blocks]) * tier.fmt.nbytes
    return {
        "network_parse_mb_s": size / net_s / 1e6,
        "network_parse_concurrent_mb_s": size / concurrent_s / 1e6,
        "network_direct_mb_s": size / direct_s / 1e6,
        "checksum_mb_s": size / checksum_s / 1e6,
        "decode_mb_s": size / decode_s / 1e6,
        "copy_to_pool_mb_s": pool_bytes / copy_s / 1e6,
        "get_run_mb_s": len(blocks) * tier.fmt.nbytes / run_s / 1e6,
    }


def _resume_once(
    config: EngineConfig,
    loaded: LoadedModel,
    client: redis.Redis,
    turn: list[int],
    tier_dtype: str,
    stages: bool,
) -> tuple[dict[str, Any], dict[str, float]]:
    """One resume of ``turn`` (its history, then TAIL new tokens): its row, and the read path's
    stages when asked."""
    history = turn[:-TAIL]
    writer_engine = _engine(config, loaded)  # the worker that served the session so far
    tier = RedisTier(client, writer_engine.served.kv_format, 8 * 1024**3, tier_dtype=tier_dtype)
    writer = KVWriter(tier)
    assert writer_engine.tiers is not None
    writer_engine.tiers.attach(writer)
    writer_engine.generate([[*history, history[-1]]], SamplingParams(max_tokens=1, ignore_eos=True))
    writer.flush(120)
    writer.stop()
    del writer_engine
    gc.collect()  # a worker has one engine: the bench's retired ones must not hold memory

    fresh = _engine(config, loaded)  # another worker: nothing of this session local
    _ttft(fresh, [7, 8, 9])  # first-forward warm-up, outside the timing
    writes = _timed_writes(fresh)
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    fetched = prefetch(EngineTarget(fresh), tier, turn, "")
    fetch_s = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    out_ttft = _ttft(fresh, turn)
    loaded_s = fetch_s + out_ttft
    # end to end, Redis -> pool tensor: the prefetch (MGETs, checksums, decode, into the warm
    # tier) and the engine's copies of those blocks into its pool
    fetch_mb_s = fetched * fresh.served.kv_format.nbytes / (fetch_s + writes[0]) / 1e6 if fetched else 0.0
    measured: dict[str, float] = {}
    if stages:
        bs = fresh.pool.block_size
        hashes = chain(turn[: fetched * bs], bs, loaded.fingerprint, "")
        pool = KVCache(fresh.served.layout, max(1, fetched), "cpu")
        pool.block_writer = fresh.executor.kv_cache.block_writer  # the engine's own copier
        measured = _stages(tier, hashes, pool)
    del fresh
    gc.collect()

    cold = _engine(config, loaded)
    _ttft(cold, [7, 8, 9])
    recompute_s = _ttft(cold, turn)
    del cold
    gc.collect()
    tier.clear()
    row = {
        "history_tokens": len(history),
        "blocks_fetched": fetched,
        "fetch_s": fetch_s,
        "pool_write_s": writes[0],
        "fetch_mb_s": fetch_mb_s,
        # first touches of the memory the packs are received into: on a VM each can cost several
        # µs of kernel time, the fetch's slow mode (docs/architecture.md, host heap)
        "fetch_page_faults": after.ru_minflt - before.ru_minflt,
        "fetch_kernel_s": after.ru_stime - before.ru_stime,
        "prefill_after_fetch_s": out_ttft,
        "resume_from_redis_s": loaded_s,
        "recompute_s": recompute_s,
        "ratio": loaded_s / recompute_s,
    }
    return row, measured


def bench_resume(
    settings: Settings,
    loaded: LoadedModel,
    lengths: list[int],
    run_dir: Path,
    tier_dtype: str = "exact",
    reps: int = 3,
) -> dict[str, Any]:
    """Each length resumed ``reps`` times (a fresh writer, resumer and recomputer each time); its
    row is the repetition with the median ratio, and lists every repetition's ratio."""
    config = settings.engine_config()
    vocab = int(loaded.model.config.vocab_size)
    rng = torch.Generator().manual_seed(5)
    rows = []
    stages: dict[str, float] = {}
    headline = FULL_LENGTH if FULL_LENGTH in lengths else max(lengths)
    with RedisServer(run_dir / "redis") as server:
        client = redis.Redis.from_url(server.url)
        for length in lengths:
            turn = torch.randint(100, vocab, (length + TAIL,), generator=rng).tolist()
            runs = []
            for rep in range(reps):
                row, measured = _resume_once(
                    config, loaded, client, turn, tier_dtype, stages=rep == 0 and length == headline
                )
                runs.append(row)
                stages = measured or stages
            row = sorted(runs, key=lambda r: r["ratio"])[len(runs) // 2]
            row["ratios"] = [r["ratio"] for r in runs]
            rows.append(row)
            ms = {
                k: row[k] * 1000 for k in ("resume_from_redis_s", "fetch_s", "fetch_kernel_s", "recompute_s")
            }
            print(
                f"  resume {length:>5} tokens: redis {ms['resume_from_redis_s']:7.1f} ms (fetch "
                f"{ms['fetch_s']:6.1f}, {row['fetch_mb_s']:5.0f} MB/s, {row['fetch_page_faults']} page "
                f"faults, {ms['fetch_kernel_s']:.0f} ms in the kernel) vs recompute "
                f"{ms['recompute_s']:7.1f} ms -> {row['ratio']:.3f} "
                f"(of {reps}: {', '.join(f'{r:.3f}' for r in row['ratios'])})",
                flush=True,
            )
    print("  read path stages (MB/s): " + ", ".join(f"{k} {v:.0f}" for k, v in stages.items()), flush=True)
    return summary(rows, stages, headline, reps, tier_dtype)
