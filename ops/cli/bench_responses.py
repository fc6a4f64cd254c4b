"""`kvferry bench responses` (the run itself is ops/bench/responses/run.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ops.cli.engine import _write_json, bench, json_option
from ops.cli.options import engine_options, settings_from


@bench.command("responses")
@json_option
@click.option("--workers", type=int, default=2, show_default=True)
@click.option("--conversations", type=int, default=16, show_default=True)
@click.option("--turns", type=int, default=8, show_default=True, help="turns 3, 5, 7... move")
@click.option("--output-tokens", type=int, default=8, show_default=True)
@click.option("--backgrounds", type=int, default=16, show_default=True, help="background submissions timed")
@click.option("--think-s", type=float, default=1.0, show_default=True, help="pause between turns")
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), help="stack logs")
@engine_options
def bench_responses_cmd(
    json_path: Path | None,
    workers: int,
    conversations: int,
    turns: int,
    output_tokens: int,
    backgrounds: int,
    think_s: float,
    run_dir: Path | None,
    **opts: Any,
) -> None:
    """Responses by previous_response_id on a kvferry stack, each conversation moved between
    workers every other turn: a moved turn vs the same turn on the worker that kept the
    conversation and vs a cold recompute (TTFT), and background submissions' answer time."""
    from ops.bench.responses.run import Config, run

    cfg = Config(conversations, turns, output_tokens, backgrounds, think_s=think_s)
    doc = run(settings_from(opts), workers, cfg, run_dir, lambda m: click.echo(m, err=True))
    keys = ("moved_vs_kept_ttft", "moved_vs_kept_ttft_same_compute", "moved_vs_recompute_ttft")
    for key in (*keys, "background_submit_p50_ms"):
        if doc.get(key) is not None:
            click.echo(f"{key}: {doc[key]:.3f}")
    _write_json(doc, json_path)
