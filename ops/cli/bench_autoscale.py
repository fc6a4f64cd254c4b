"""`kvferry bench autoscale` (the run itself is ops/bench/autoscale/run.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click

from ops.cli.engine import _write_json, bench, json_option


@bench.command("autoscale")
@json_option
@click.option("--autoscale", "bounds", default="1:8", show_default=True, help="MIN:MAX workers")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--duration-s", type=float, default=900.0, show_default=True, help="the trace's length")
@click.option("--seats", type=int, default=8, show_default=True, help="engine seats per worker")
@click.option("--worker-start-s", type=float, default=5.0, show_default=True, help="a new worker's start")
@click.option("--scrape-s", type=float, default=5.0, show_default=True, help="how often the policy is read")
@click.option("--base-rate", type=float, default=0.4, show_default=True, help="jobs/s between bursts")
@click.option("--burst-rate", type=float, default=6.0, show_default=True, help="jobs/s in a burst")
@click.option("--pool-blocks", type=int, default=0, show_default=True, help="KV blocks a worker (0: no pool)")
@click.option(
    "--prompt-tokens",
    type=float,
    default=1000.0,
    show_default=True,
    help="median prompt (with --pool-blocks)",
)
def bench_autoscale_cmd(
    json_path: Path | None,
    bounds: str,
    seed: int,
    duration_s: float,
    seats: int,
    worker_start_s: float,
    scrape_s: float,
    base_rate: float,
    burst_rate: float,
    pool_blocks: int,
    prompt_tokens: float,
) -> None:
    """The scaling policy on a seeded bursty trace (simulated-engine workers, a fleet model):
    queue wait p95 and worker-seconds under --autoscale vs static fleets of MAX and MIN; with
    --pool-blocks, jobs take KV blocks too, and the policy blind to the pools is run beside."""
    from ops.bench.autoscale.run import run_autoscale
    from ops.bench.autoscale.trace import TraceSpec
    from ops.scale.autoscaler import parse_bounds
    from ops.settings import Settings

    low, high = parse_bounds(bounds)
    # the api's policy (api/config.py: the settings' figures), within these bounds
    policy = Settings.from_env().api_config().scale_policy
    policy = dataclasses.replace(policy, min_workers=low, max_workers=high)
    spec = TraceSpec(
        seed=seed,
        duration_s=duration_s,
        base_rate=base_rate,
        burst_rate=burst_rate,
        prompt_tokens_median=prompt_tokens if pool_blocks else 0.0,
    )
    result = run_autoscale(spec, (low, high), seats, policy, worker_start_s, scrape_s, pool_blocks)
    _write_json(result, json_path)
    click.echo(json.dumps({k: v for k, v in result.items() if not isinstance(v, dict)}, indent=2))
