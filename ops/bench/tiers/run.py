"""`kvferry bench tiers`: what the Redis tier and cache-aware routing buy, side by side in one run.

1. Resume: a 2,048-token session continued on an engine that never saw it, loading its blocks
   from Redis, against recomputing them; then the same at other lengths, to find where loading
   stops paying (below some length, recomputing is cheaper than the round trips).
2. Multi-turn workload through the whole stack (2 workers): sessions sharing system prompts, each
   turn resending the history. Prefix hit rate and p50/p95 TTFT with cache-aware routing, with
   round-robin routing, and both again without the Redis tier; cache-aware's TTFT against
   round-robin's, both with the Redis tier (`cache_aware_vs_round_robin_ttft_p50`, `_p95`). The
   workload is a closed loop of sessions without think time: its TTFTs swing from run to run more
   than the routings differ, so `--workload-reps` runs the two back to back several times and the
   ratios are the medians of the pairs' (each pair shares the machine's state of the moment).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import torch

from ops.bench.tiers.api_ttft import bench_api_ttft
from ops.bench.tiers.multiturn import workload
from ops.bench.tiers.realistic import realistic_bench
from ops.bench.tiers.resume import bench_resume
from ops.bench.tiers.resume_figures import headline, headline_keys
from ops.settings import Settings
from ops.stack.run_dir import stack_run_dir
from workers.engine.model.kv_layout import kv_layout
from workers.engine.model.loader import load_model
from workers.engine.model.precision import Precision
from workers.process.host_heap import keep_freed_memory

# Repetitions per case in a full run, the median reported: the resume and API rows sit near their
# targets, and on a shared 2-core machine a median of 3 moves from run to run across them
# (docs/benchmarks.md).
FULL_REPS = 5


def run_tier_bench(
    settings: Settings,
    quick: bool,
    skip: set[str],
    workload_reps: int = 1,
    kind: str = "closed",
    load: str = "overload",
) -> dict[str, Any]:
    results: dict[str, Any] = {"model": settings.served_model, "quick": quick, "workload_kind": kind}
    with stack_run_dir("kvferry-tiers-", settings.cache_dir / "bench-logs") as run_dir:
        if kind == "realistic":  # the routing comparison on it alone (ops/bench/tiers/realistic.py)
            results.update(_realistic(settings, quick, workload_reps, run_dir, load))
            return results
        if "resume" not in skip:
            # this process plays the worker that resumes: its host heap set up as a worker's is,
            # before the model load (workers/process/main.py)
            keep_freed_memory(settings.tier_config().host_heap_reserve_bytes)
            loaded = load_model(settings.model, settings.dtype, settings.device, settings.cache_dir)
            lengths = [64, 256, 1024] if quick else [16, 32, 64, 128, 256, 512, 1024, 2048]
            results["resume"] = bench_resume(
                settings, loaded, lengths, run_dir / "resume", reps=1 if quick else FULL_REPS
            )
            results.update(headline(results["resume"]))
            del loaded
        if "workload" not in skip:
            sessions, turns = (16, 4) if quick else (64, 6)
            configs = [
                ("cache-aware", str(settings.redis_cache_size)),
                ("round-robin", str(settings.redis_cache_size)),
                ("cache-aware", "0"),  # routing's own value, without the Redis tier
                ("round-robin", "0"),
            ]
            if "no-tier" in skip:  # the routing comparison alone: both with the Redis tier
                configs = configs[:2]
            pairs = [configs[:2]] * (workload_reps - 1)  # more runs of the Redis tier's two routings
            runs = [*configs, *(c for pair in pairs for c in pair)]
            results["workload"] = [
                workload(settings, routing, cache, sessions, turns, 16, run_dir / f"w{i}")
                for i, (routing, cache) in enumerate(runs)
            ]
            results["hit_rate"] = results["workload"][0]["hit_rate"]  # cache-aware, Redis tier
            results.update(_routing_ratios(results["workload"], len(configs)))
        if "api" not in skip:  # a cached prompt through the API right after a long turn
            results["api_ttft"] = bench_api_ttft(settings, run_dir / "api", reps=1 if quick else FULL_REPS)
            for key in ("api_cached_ttft_ratio", "api_vs_engine_cached"):
                results[key] = results["api_ttft"][key]
    rows = [("measure", "value")]
    if "resume" in results:
        r = results["resume"]
        n, named = r["headline_tokens"], headline_keys(r["headline_tokens"])
        rows.append(
            (
                f"resume {n:,}-token session: Redis vs recompute (time ratio)",
                f"{r[named['resume_ratio']]:.3f}",
            )
        )
        rows.append(("loading pays from (history tokens)", str(r["loading_pays_from_tokens"])))
        rows.append((f"resume {n:,}-token fetch, Redis -> pool (MB/s)", f"{r[named['fetch_mb_s']]:.0f}"))
        stages = r[named["stages_mb_s"]]
        raw = stages.get("network_parse_mb_s", float("nan"))
        rows.append(("  the same packs by plain redis-py MGET, nothing decoded (MB/s)", f"{raw:.0f}"))
        raw = stages.get("network_parse_concurrent_mb_s", float("nan"))
        rows.append(("  the same, as many MGETs in flight as the tier's fetch (MB/s)", f"{raw:.0f}"))
        direct = stages.get("network_direct_mb_s", float("nan"))
        rows.append(("  the same MGETs received straight into buffers (MB/s)", f"{direct:.0f}"))
    for w in results.get("workload", []):
        label = f"{w['routing']}{'' if w['redis_tier'] else ', no Redis tier'}"
        rows.append(
            (
                f"workload hit rate / after turn 1 / of reusable / p50 / p95 TTFT / p50 TPOT ({label})",
                f"{w['hit_rate']:.1%} / {w['hit_rate_after_first_turn']:.1%} / "
                f"{w['hit_share_of_reusable']:.1%} / {w['ttft_p50_s'] * 1000:.0f} / "
                f"{w['ttft_p95_s'] * 1000:.0f} / {w['tpot_p50_s'] * 1000:.0f} ms",
            )
        )
    if "workload" in results:
        p50, p95 = (
            results["cache_aware_vs_round_robin_ttft_p50"],
            results["cache_aware_vs_round_robin_ttft_p95"],
        )
        n_pairs = len(results["cache_aware_vs_round_robin_ttft_p50_pairs"])
        label = "" if n_pairs == 1 else f", median of {n_pairs} pairs"
        rows.append(
            (
                f"workload TTFT, cache-aware vs round-robin (Redis tier{label}): p50 / p95",
                f"{p50:.3f} / {p95:.3f}",
            )
        )
        rows.append(
            (
                f"workload TPOT p50 and wall time, cache-aware vs round-robin (Redis tier{label})",
                f"{results['cache_aware_vs_round_robin_tpot_p50']:.3f} / "
                f"{results['cache_aware_vs_round_robin_wall']:.3f}",
            )
        )
    if "api_ttft" in results:
        t = results["api_ttft"]
        rows.append(
            (
                "API cached / cold TTFT after a long turn (vs engine cached)",
                f"{t['api_cached_ttft_ratio']:.3f} ({t['api_cached_ttft_s'] * 1000:.0f} / "
                f"{t['api_cold_ttft_s'] * 1000:.0f} ms; {t['api_vs_engine_cached']:.2f}x engine)",
            )
        )
    width = max(len(a) for a, _ in rows)
    print("\n".join(f"{a.ljust(width)}  {b}" for a, b in rows), flush=True)
    return results


def _realistic(settings: Settings, quick: bool, reps: int, run_dir: Path, load: str) -> dict[str, Any]:
    loaded = load_model(settings.model, settings.dtype, settings.device, settings.cache_dir)
    kv = Precision.resolve(settings.dtype, settings.kv_cache_dtype, settings.device).kv
    per_token = kv_layout(loaded, settings.block_size, getattr(torch, kv)).bytes_per_token
    del loaded
    out = realistic_bench(settings, quick, per_token, run_dir, reps, load)
    for key in (
        "ttft_p50_ratio",
        "ttft_p95_ratio",
        "redis_tier_bytes_per_turn_ratio",
        "redis_tier_bytes_used_per_turn_ratio",
        "tpot_p50_ratio",
    ):
        print(f"realistic workload, cache-aware vs round-robin: {key} {out[key]:.3f}", flush=True)
    low, high = out["ttft_p50_ratio_ci95"]
    print(
        f"  ttft_p50_ratio: 95 % interval {low:.3f}–{high:.3f} over the pairs, every turn pooled "
        f"{out['ttft_p50_ratio_pooled']:.3f}, "
        f"turn against turn {out['ttft_matched_gap_p50_s'] * 1000:+.0f} ms",
        flush=True,
    )
    for r in out["runs"]:
        causes = ", ".join(f"{c} {b / 1e6:.1f}" for c, b in r["redis_tier_bytes_read_by_cause"].items())
        print(
            f"  {r['routing']}: TTFT p50 / p95 {r['ttft_p50_s'] * 1000:.0f} / "
            f"{r['ttft_p95_s'] * 1000:.0f} ms, hit {r['hit_share_of_reusable']:.1%} of reusable, "
            f"Redis read {r['redis_tier_bytes_read_per_turn'] / 1e6:.2f} MB/turn, "
            f"{r['redis_tier_bytes_used_per_turn'] / 1e6:.2f} of it used (MB read by cause: {causes}), "
            f"blocks fetched {r['redis_tier_blocks_fetched']} / hit {r['redis_tier_blocks_hit']}, "
            f"{r['session_moves']} moves, busiest worker {r['busiest_worker_share']:.0%}, "
            f"{r['preemptions']} preemptions, TTFT p50 by worker "
            f"{', '.join(f'{v * 1000:.0f}' for v in r['ttft_p50_by_worker_s'].values())} ms, "
            f"{r['ttft_over_wait_target_share']:.0%} over the wait target",
            flush=True,
        )
    return out


def _routing_ratios(runs: list[dict[str, Any]], first_configs: int) -> dict[str, Any]:
    """Cache-aware's TTFT against round-robin's (both with the Redis tier), per back-to-back pair:
    the first run's first two set-ups, then each extra pair; the medians are the headline."""
    pairs = [(runs[0], runs[1])] + [(runs[i], runs[i + 1]) for i in range(first_configs, len(runs) - 1, 2)]
    out: dict[str, Any] = {}
    for key in ("ttft_p50", "ttft_p95", "tpot_p50", "wall"):
        ratios = [aware[f"{key}_s"] / robin[f"{key}_s"] for aware, robin in pairs]
        out[f"cache_aware_vs_round_robin_{key}"] = statistics.median(ratios)
        out[f"cache_aware_vs_round_robin_{key}_pairs"] = ratios
    return out
