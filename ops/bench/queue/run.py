"""`kvferry bench queue`: what the queue costs and what a second worker buys, in one run.

1. Overhead: a 1-token job through HTTP -> Redis queue -> worker engine -> result, against the
   same call made on an engine in this process (the two alternate); p50/p99 of both, their
   difference, and where the queued job's milliseconds go, stage by stage (ops/bench/queue/stages.py).
2. Scaling: the same burst of streaming chat requests through the API with one worker, then two
   (one torch thread each); output tokens per second, and the ratio.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from api.stage_clock import REQUEST_HEADER
from broker.redis.connect import connect
from broker.sampling import SamplingParams
from ops.bench.queue import stages as queue_stages
from ops.bench.queue.stages import pct
from ops.bench.served.serve import run_load, summarize
from ops.redis.server import free_port
from ops.settings import Settings
from ops.stack.run_dir import stack_run_dir
from ops.stack.stack import Stack
from workers.engine.factory import build_engine

PROMPT = "The capital of France is"
WARMUP = 5


def _stack(settings: Settings, workers: int, run_dir: Path) -> Stack:
    return Stack(settings.with_overrides(api_port=free_port()), workers, run_dir=run_dir, with_flower=False)


def bench_overhead(settings: Settings, requests: int, run_dir: Path) -> dict[str, Any]:
    # One torch thread on both sides: the worker then leaves a core to the api and Redis, as a
    # deployment would give them their own; the direct call gets the same compute. Direct and
    # queued calls alternate, so both see the same load from whatever else runs on the machine.
    settings = settings.with_overrides(torch_threads=1)
    engine = build_engine(settings.engine_config(), cache_dir=settings.cache_dir)
    ids = engine.served.tokenizer(PROMPT)["input_ids"]
    params = SamplingParams(max_tokens=1, temperature=0.0)
    direct: list[float] = []
    queued: list[float] = []
    runs: list[dict[str, float]] = []
    with _stack(settings, 1, run_dir) as stack:
        stack.wait_ready()
        body = {"model": settings.served_model, "prompt": PROMPT, "max_tokens": 1, "temperature": 0}
        asks = {REQUEST_HEADER: "1"}
        rds = connect(stack.settings.queue_url)
        with httpx.Client(base_url=stack.api_url, timeout=60) as client:
            for i in range(requests + WARMUP):
                started = time.perf_counter()
                engine.generate([ids], params)
                took_direct = time.perf_counter() - started
                sent, started = time.time(), time.perf_counter()
                response = client.post("/v1/completions", json=body, headers=asks)
                took_queued, received = time.perf_counter() - started, time.time()
                response.raise_for_status()
                if i >= WARMUP:
                    direct.append(took_direct)
                    queued.append(took_queued)
                    runs.append(queue_stages.stamps(response, rds, sent, received))
        rds.close()
    del engine
    ms = 1000.0
    out: dict[str, Any] = {
        "requests": requests,
        "direct_p50_ms": pct(direct, 50) * ms,
        "direct_p99_ms": pct(direct, 99) * ms,
        "queued_p50_ms": pct(queued, 50) * ms,
        "queued_p99_ms": pct(queued, 99) * ms,
        "direct_mean_ms": statistics.fmean(direct) * ms,
        "queued_mean_ms": statistics.fmean(queued) * ms,
    }
    out["queue_overhead_p50_ms"] = out["queued_p50_ms"] - out["direct_p50_ms"]
    out["queue_overhead_p99_ms"] = out["queued_p99_ms"] - out["direct_p99_ms"]
    # the same difference taken pair by pair: less noisy than a difference of percentiles
    paired = [(q - d) * ms for q, d in zip(queued, direct, strict=True)]
    out["paired_overhead_p50_ms"] = pct(paired, 50)
    out["paired_overhead_p99_ms"] = pct(paired, 99)
    out["stages"] = queue_stages.summarize(runs)
    return out


def _burst(
    settings: Settings, workers: int, concurrency: int, duration_s: float, max_tokens: int, run_dir: Path
) -> dict[str, Any]:
    with _stack(settings.with_overrides(torch_threads=1), workers, run_dir) as stack:
        stack.wait_ready()
        started = time.perf_counter()
        records = asyncio.run(
            run_load(stack.api_url, settings.served_model, concurrency, duration_s, max_tokens)
        )
        return summarize(records, time.perf_counter() - started)


def bench_scaling(
    settings: Settings, concurrency: int, duration_s: float, max_tokens: int, run_dir: Path
) -> dict[str, Any]:
    one = _burst(settings, 1, concurrency, duration_s, max_tokens, run_dir / "one")
    two = _burst(settings, 2, concurrency, duration_s, max_tokens, run_dir / "two")
    return {
        "one_worker": one,
        "two_workers": two,
        "throughput_ratio_2_vs_1": two["output_tokens_per_s"] / one["output_tokens_per_s"],
    }


def run_queue_bench(settings: Settings, quick: bool, skip: set[str]) -> dict[str, Any]:
    results: dict[str, Any] = {"model": settings.served_model, "quick": quick}
    rows = [("measure", "queued / 2 workers", "direct / 1 worker", "difference or ratio")]
    with stack_run_dir("kvferry-bench-", settings.cache_dir / "bench-logs") as run_dir:
        if "overhead" not in skip:
            o = bench_overhead(settings, 30 if quick else 200, run_dir / "overhead")
            results.update(o)
            rows.append(
                (
                    "1-token job p50 (ms)",
                    f"{o['queued_p50_ms']:.1f}",
                    f"{o['direct_p50_ms']:.1f}",
                    f"+{o['queue_overhead_p50_ms']:.1f} ms",
                )
            )
            rows.append(
                (
                    "1-token job p99 (ms)",
                    f"{o['queued_p99_ms']:.1f}",
                    f"{o['direct_p99_ms']:.1f}",
                    f"+{o['queue_overhead_p99_ms']:.1f} ms",
                )
            )
        if "publish" not in skip:
            from ops.bench.queue.publish import bench_publish

            p = bench_publish(100 if quick else 500)
            results["publish"] = p
            rows.append(
                (
                    "api publish of one job p50 (ms): send-only backend vs Celery's",
                    f"{p['publish_send_only_p50_ms']:.2f}",
                    f"{p['publish_celery_backend_p50_ms']:.2f}",
                    f"{p['publish_p50_ratio']:.2f}x",
                )
            )
        if "scaling" not in skip:
            s = bench_scaling(settings, 16 if quick else 32, 20 if quick else 60, 32, run_dir / "scaling")
            results["scaling"] = s
            results["throughput_ratio_2_vs_1"] = s["throughput_ratio_2_vs_1"]
            rows.append(
                (
                    "output tok/s, 2 workers vs 1 (1 torch thread each)",
                    f"{s['two_workers']['output_tokens_per_s']:.1f}",
                    f"{s['one_worker']['output_tokens_per_s']:.1f}",
                    f"{s['throughput_ratio_2_vs_1']:.2f}x",
                )
            )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    print("\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows), flush=True)
    if "stages" in results:
        print("\nwhere a queued 1-token job's time goes (1 worker):", flush=True)
        print(queue_stages.table(results["stages"]), flush=True)
    return results
