"""`kvferry bench served-decode` (the run itself is ops/bench/served/decode.py)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import click

from ops.cli.engine import _write_json, bench, json_option
from ops.cli.options import engine_options, settings_from


@bench.command("served-decode")
@json_option
@click.option("--rounds", type=int, default=2, show_default=True, help="runs of each side, alternated")
@click.option("--requests", type=int, default=64, show_default=True)
@click.option("--concurrency", type=int, default=16, show_default=True)
@click.option("--input-len", type=int, default=128, show_default=True)
@click.option("--output-len", type=int, default=64, show_default=True)
@click.option(
    "--hold", type=float, default=1.0, show_default=True,
    help="prefill_batch_hold of the runs with the admission hold on",
)  # fmt: skip
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), help="logs (default: temp)")
@engine_options
def bench_served_decode_cmd(json_path: Path | None, hold: float, **opts: Any) -> None:
    """Served median TPOT (vLLM bench serve's random workload) vs the engine's decode-only step at
    the same batch, with the admission hold on and off, alternated: ratios."""
    from ops.bench.served.decode import render, run_served_decode

    sizes = {k: opts.pop(k) for k in ("rounds", "requests", "concurrency", "input_len", "output_len")}
    run_dir = opts.pop("run_dir") or Path(tempfile.mkdtemp(prefix="kvferry-bench-served-"))
    result = run_served_decode(
        settings_from(opts), run_dir, hold, **sizes, log=lambda m: click.echo(m, err=True)
    )
    _write_json(result, json_path)
    click.echo(render(result))
