"""Engine commands: the offline batch runner and the engine benchmark."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from broker.errors import KvferryError
from ops.cli_options import build_engine, engine_options, settings_from


@click.command("run-batch")
@click.argument("input_path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--output", "output_path", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--stats", "stats_path", type=click.Path(dir_okay=False, path_type=Path), help="write figures JSON"
)
@engine_options
def run_batch_cmd(input_path: Path, output_path: Path, stats_path: Path | None, **opts: Any) -> None:
    """Run an OpenAI Batch JSONL file through one engine; every line is batched together."""
    from ops.run_batch import read_lines, run_batch, stats_document, write_jsonl

    settings = settings_from(opts)
    try:
        engine = build_engine(settings)
    except (KvferryError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    lines = read_lines(input_path, engine.model_id)
    started = time.perf_counter()
    records, figures = run_batch(engine, lines)
    wall = time.perf_counter() - started
    write_jsonl(output_path, records)
    ok = sum(1 for r in records if r["error"] is None)
    doc = stats_document(engine, figures, wall)
    click.echo(
        f"{ok}/{len(records)} lines ok in {wall:.1f}s; prefix hits {doc['prefix_cache_hits_tokens']}/"
        f"{doc['prefix_cache_queries_tokens']} prompt tokens; peak pool {doc['pool_blocks_peak_used']}/"
        f"{doc['pool_blocks_total']} blocks -> {output_path}",
        err=True,
    )
    if stats_path is not None:
        stats_path.write_text(json.dumps(doc, indent=2))


@click.group()
def bench() -> None:
    """Benchmarks: ours and a baseline, side by side in one run."""


@bench.command("engine")
@click.option(
    "--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="write results JSON"
)
@click.option("--quick", is_flag=True, help="smaller sizes, for a smoke run")
@click.option(
    "--skip", multiple=True, type=click.Choice(["ttft", "throughput", "sharing"]), help="skip a part"
)
@engine_options
def bench_engine_cmd(json_path: Path | None, quick: bool, skip: tuple[str, ...], **opts: Any) -> None:
    """TTFT cached vs cold, decode throughput vs HF generate, pool bytes shared vs unshared."""
    from ops.bench_engine import run_engine_bench

    results = run_engine_bench(settings_from(opts), quick=quick, skip=set(skip))
    if json_path is not None:
        json_path.write_text(json.dumps(results, indent=2))
        click.echo(f"wrote {json_path}", err=True)
