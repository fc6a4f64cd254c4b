"""`kvferry bench lm-eval` (the run itself is ops/bench/quality/lm_eval_bench.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from ops.cli.engine import _write_json, bench, json_option
from ops.cli.options import engine_options, settings_from


@bench.command("lm-eval")
@json_option
@click.option(
    "--modes",
    help="comma-separated, among float32/kv-float32, bfloat16/kv-bfloat16, int8/kv-bfloat16, "
    "bfloat16/kv-int8 (default: all four)",
)
@click.option("--batch-size", type=int, default=4, show_default=True, help="lm-eval's requests per call")
@click.option("--limit", type=int, help="the first N questions only (default: all 100)")
@click.option(
    "--baseline",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="an earlier run's --json: reuse its HF fp32 figures (deterministic) instead of running hf",
)
@engine_options
def bench_lm_eval_cmd(
    json_path: Path | None,
    modes: str | None,
    batch_size: int,
    limit: int | None,
    baseline: Path | None,
    **opts: Any,
) -> None:
    """lm-eval's multiple-choice loglikelihood through /v1/completions in each precision vs lm-eval's
    `hf` model in fp32 (a local 100-question task; needs the `eval` extra)."""
    from ops.bench.quality.lm_eval_bench import report, run_lm_eval_bench

    try:
        hf = json.loads(baseline.read_text())["hf_fp32"] if baseline else None
        results = run_lm_eval_bench(
            settings_from(opts), modes.split(",") if modes else None, batch_size, limit, hf
        )
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(report(results))
    _write_json(results, json_path)
