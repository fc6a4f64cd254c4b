"""The three fleets on one trace: --autoscale MIN:MAX vs a static MAX and a static MIN; ratios
against the static MAX (the fleet an operator sizes for the burst). With a KV pool (pool_blocks),
a fourth: --autoscale with the policy blind to the pools (seats and queue wait only)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from api.scale.policy import ScalePolicy
from ops.bench.autoscale.fleet_model import FleetRun, run_fleet
from ops.bench.autoscale.trace import TraceSpec, make_trace


def run_autoscale(
    spec: TraceSpec,
    bounds: tuple[int, int],
    seats: int,
    policy: ScalePolicy,
    start_s: float = 5.0,
    scrape_s: float = 5.0,
    pool_blocks: int = 0,
) -> dict[str, Any]:
    """start_s: a new worker's start (process and engine); scrape_s: how often the policy is read;
    pool_blocks: each worker's KV pool (0: none; the trace's jobs carry blocks when it has one)."""
    jobs = make_trace(spec)
    low, high = bounds
    auto = run_fleet(jobs, seats, low, policy, start_s=start_s, scrape_s=scrape_s, pool_blocks=pool_blocks)
    static_max = run_fleet(jobs, seats, high, None, pool_blocks=pool_blocks)
    static_min = run_fleet(jobs, seats, low, None, pool_blocks=pool_blocks)

    def figures(r: FleetRun) -> dict[str, Any]:
        wait, life = round(r.queue_wait_p95_s, 3), round(r.worker_seconds, 1)
        return {"queue_wait_p95_s": wait, "worker_seconds": life, "max_workers": r.max_workers}

    blind: dict[str, Any] = {}
    if pool_blocks:
        b = run_fleet(
            jobs, seats, low, policy, start_s, scrape_s=scrape_s, pool_blocks=pool_blocks, pool_blind=True
        )
        blind = {
            "autoscale_pool_blind": figures(b),
            "queue_wait_p95_ratio_vs_pool_blind": round(_ratio(auto.queue_wait_p95_s, b.queue_wait_p95_s), 3),
            "worker_seconds_ratio_vs_pool_blind": round(auto.worker_seconds / b.worker_seconds, 3),
        }
    return {
        "model": "fleet model (ops/bench/autoscale/fleet_model.py) driven by api/scale/policy.py",
        "trace": asdict(spec),
        "jobs": len(jobs),
        "worker_start_s": start_s,
        "scrape_s": scrape_s,
        "seats_per_worker": seats,
        "pool_blocks": pool_blocks,
        "bounds": [low, high],
        "policy": asdict(policy),
        "autoscale": figures(auto),
        f"static_{high}": figures(static_max),
        f"static_{low}": figures(static_min),
        "queue_wait_p95_s": round(auto.queue_wait_p95_s, 3),
        "worker_seconds": round(auto.worker_seconds, 1),
        "worker_seconds_ratio": round(auto.worker_seconds / static_max.worker_seconds, 3),
        "queue_wait_p95_ratio": round(_ratio(auto.queue_wait_p95_s, static_max.queue_wait_p95_s), 3),
        f"worker_seconds_ratio_vs_static_{low}": round(auto.worker_seconds / static_min.worker_seconds, 3),
        f"queue_wait_p95_ratio_vs_static_{low}": round(
            _ratio(auto.queue_wait_p95_s, static_min.queue_wait_p95_s), 3
        ),
        **blind,
    }


def _ratio(a: float, b: float, floor_s: float = 0.25) -> float:
    """a / b with both at least floor_s (the model's time step): a zero wait is no division."""
    return max(a, floor_s) / max(b, floor_s)
