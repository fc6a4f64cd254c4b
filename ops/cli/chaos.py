"""The `kvferry chaos` command line (the run itself is ops/chaos/run.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from ops.cli.options import engine_options, service_options, settings_from


@click.command("chaos")
@click.option("--workers", type=int, default=2, show_default=True, help="workers of the stack it starts")
@click.option("--clients", type=int, help="concurrent streaming clients (16; --quick: 4)")
@click.option("--kills", type=int, help="workers SIGKILLed and restarted (20; --quick: 2; --soak: 0)")
@click.option("--redis-restarts", type=int, help="restarts of the queue's Redis (1; --soak: 0)")
@click.option(
    "--failovers",
    type=int,
    help="SIGKILLs of the queue's primary; the stack then runs the queue Redis under Sentinel (--ha)",
)
@click.option(
    "--kv-shard-kills",
    type=int,
    help="SIGKILLs of a KV shard, each started again empty; the KV tier then runs on a local 3-shard cluster",
)
@click.option("--batch", is_flag=True, help="a Batch API batch under the faults instead of chat clients")
@click.option("--batch-lines", type=int, help="lines of the --batch batch (600; --quick: 60)")
@click.option("--api-restarts", type=int, help="SIGKILLs of the api, each started again (--batch: 1)")
@click.option(
    "--scale-in", "scale_ins", type=int, help="busy workers SIGTERMed (they drain), each started again"
)
@click.option("--turns", type=int, help="chat turns per session (3; --quick: 2)")
@click.option("--max-tokens", type=int, help="tokens per answer (32; --quick: 8)")
@click.option("--quick", is_flag=True, help="a small run (2 kills, 1 Redis restart, 4 clients, tiny prompts)")
@click.option("--soak", "soak_minutes", type=float, help="keep the load up this long; samples worker RSS")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--api-url", help="use this running stack instead of starting one (no faults then)")
@click.option("--api-key", help="its API key, if it has one")
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), help="logs (default: temp)")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="write the report")
@service_options
@engine_options
def chaos_cmd(
    workers: int,
    quick: bool,
    soak_minutes: float | None,
    seed: int,
    api_url: str | None,
    api_key: str | None,
    run_dir: Path | None,
    json_path: Path | None,
    redis_url: str | None,
    batch: bool,
    batch_lines: int | None,
    api_restarts: int | None,
    **opts: Any,
) -> None:
    """Kill workers and restart Redis under a streaming load, then check that every job finished
    token-exact against a fault-free pass, each token streamed once, none lost, the pools intact,
    and a sample of jobs token-exact against HF generate. Exits 1 if not. It computes in fp32
    unless --dtype, --kv-cache-dtype or --quantization ask for another precision: each stream is
    then checked against its job's own answer (ops/chaos/own_answers.py)."""
    from ops.chaos.check import render
    from ops.chaos.run import ChaosConfig, run_chaos

    if batch:
        _batch_chaos(workers, quick, seed, batch_lines, api_restarts, run_dir, json_path, opts)
        return
    if batch_lines is not None or api_restarts is not None:
        raise click.UsageError("--batch-lines and --api-restarts go with --batch")
    faults = ("kills", "redis_restarts", "failovers", "kv_shard_kills", "scale_ins")
    load = {k: opts.pop(k) for k in ("clients", *faults, "turns", "max_tokens")}
    if api_url is not None and redis_url is None:
        raise click.UsageError("--api-url needs --redis-url too (the workers' integrity check uses it)")
    if soak_minutes:
        load = {
            "kills": 0,
            "redis_restarts": 0,
            "failovers": 0,
            "kv_shard_kills": 0,
            "scale_ins": 0,
            **{k: v for k, v in load.items() if v is not None},
        }
    overrides = {**load, "workers": workers, "seed": seed}
    config = ChaosConfig.quick(**overrides) if quick else ChaosConfig(**_given(overrides))
    if soak_minutes:
        from dataclasses import replace

        soak_s = soak_minutes * 60
        config = replace(config, soak_s=soak_s, rss_every_s=max(1.0, min(30.0, soak_s / 60)))
        config = replace(config, timeout_s=soak_s + config.timeout_s)
    settings = settings_from(opts).with_overrides(redis_url=redis_url, api_key=api_key)
    result = run_chaos(settings, config, api_url, run_dir, log=lambda m: click.echo(m, err=True))
    click.echo(render(result))
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=2) + "\n")
    if not result["passed"]:  # ops/chaos/check.py, verdict
        raise SystemExit(1)


def _batch_chaos(
    workers: int,
    quick: bool,
    seed: int,
    lines: int | None,
    api_restarts: int | None,
    run_dir: Path | None,
    json_path: Path | None,
    opts: dict[str, Any],
) -> None:
    """`--batch`: ops/chaos/batch.py; exits 1 unless every line came back exactly once, exact."""
    from ops.chaos.batch import BatchChaosConfig, render, run_batch_chaos

    given = {
        "workers": workers,
        "seed": seed,
        "lines": lines,
        "api_restarts": api_restarts,
        "kills": opts.pop("kills"),
        "redis_restarts": opts.pop("redis_restarts"),
        "max_tokens": opts.pop("max_tokens"),
    }
    for flag in ("clients", "turns", "failovers", "kv_shard_kills"):
        if opts.pop(flag) is not None:
            raise click.UsageError(f"--{flag.replace('_', '-')} does not go with --batch")
    config = BatchChaosConfig.quick(**given) if quick else BatchChaosConfig(**_given(given))
    result = run_batch_chaos(settings_from(opts), config, run_dir, log=lambda m: click.echo(m, err=True))
    click.echo(render(result))
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=2) + "\n")
    if not result["passed"]:
        raise SystemExit(1)


def _given(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}
