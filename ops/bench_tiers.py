"""`kvferry bench tiers`: what the Redis tier and cache-aware routing buy, side by side in one run.

1. Resume: a 2,048-token session continued on an engine that never saw it, loading its blocks
   from Redis, against recomputing them; then the same at other lengths, to find where loading
   stops paying (below some length, recomputing is cheaper than the round trips).
2. Multi-turn workload through the whole stack (2 workers): sessions sharing system prompts, each
   turn resending the history. Prefix hit rate and p50 TTFT with cache-aware routing, with
   round-robin routing, and with round-robin and no Redis tier.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from ops.bench_multiturn import workload
from ops.bench_resume import bench_resume
from ops.settings import Settings
from workers.engine.model_loader import load_model


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
                workload(settings, routing, cache, sessions, turns, 16, run_dir / f"w{i}")
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
