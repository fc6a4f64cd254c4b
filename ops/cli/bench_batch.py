"""`kvferry bench batch` (the run itself is ops/bench/batch/run.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ops.cli.engine import _write_json, bench, json_option
from ops.cli.options import engine_options, settings_from


@bench.command("batch")
@json_option
@click.option("--workers", type=int, default=2, show_default=True)
@click.option("--lines", type=int, default=512, show_default=True, help="the throughput batch's lines")
@click.option(
    "--flood-lines", type=int, default=2000, show_default=True, help="the batch under the TTFT probes"
)
@click.option("--max-tokens", type=int, default=32, show_default=True)
@click.option(
    "--probes", type=int, default=40, show_default=True, help="interactive requests, idle and under batch"
)
@click.option("--fair-jobs", type=int, default=500, show_default=True, help="tenant A's queued jobs")
@click.option("--fair-requests", type=int, default=20, show_default=True, help="tenant B's requests (1/s)")
@click.option("--concurrencies", default="16,32,64", show_default=True, help="online concurrencies tried")
@click.option("--skip", multiple=True, type=click.Choice(["throughput", "ttft", "fair"]), help="skip a phase")
@click.option("--quick", is_flag=True, help="a small run (a smoke test): few lines, probes and jobs")
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), help="logs (default: temp)")
@engine_options
def bench_batch_cmd(
    json_path: Path | None, concurrencies: str, skip: tuple[str, ...], quick: bool, **opts: Any
) -> None:
    """The Batch API vs the same requests online, interactive TTFT under a batch, and fair share
    between tenants: ratios on one stack it starts."""
    from ops.bench.batch.run import render, run_batch_bench

    settings = settings_from(opts)
    sizes = {
        k: opts.pop(k)
        for k in ("workers", "lines", "flood_lines", "max_tokens", "probes", "fair_jobs", "fair_requests")
    }
    if quick:
        sizes.update(
            lines=16, flood_lines=64, max_tokens=8, probes=3, fair_jobs=24, fair_requests=3, alone_s=2.0
        )
        concurrencies = "4,8"
    scan = tuple(int(c) for c in concurrencies.split(",") if c.strip())
    result = run_batch_bench(
        settings, **sizes, concurrencies=scan, skip=frozenset(skip), run_dir=opts.pop("run_dir"),
        log=lambda m: click.echo(m, err=True),
    )  # fmt: skip
    click.echo(render(result))
    _write_json(result, json_path)
