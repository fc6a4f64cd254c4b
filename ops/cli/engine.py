"""Engine commands: the offline batch runner and the engine benchmark."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from broker.defaults import DEFAULTS
from broker.errors import KvferryError
from ops.cli.options import build_engine, engine_options, settings_from


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
    lines = read_lines(input_path, engine.served.model_id)
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


json_option = click.option(
    "--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="write results JSON"
)


def _write_json(results: dict[str, Any], json_path: Path | None) -> None:
    if json_path is not None:
        json_path.write_text(json.dumps(results, indent=2))
        click.echo(f"wrote {json_path}", err=True)


@click.group()
def bench() -> None:
    """Benchmarks: ours and a baseline, side by side in one run."""


@bench.command("engine")
@json_option
@click.option("--quick", is_flag=True, help="smaller sizes, for a smoke run")
@click.option(
    "--skip",
    multiple=True,
    type=click.Choice(["ttft", "throughput", "sharing", "precision"]),
    help="skip a part",
)
@engine_options
def bench_engine_cmd(json_path: Path | None, quick: bool, skip: tuple[str, ...], **opts: Any) -> None:
    """TTFT cached vs cold, decode throughput vs HF generate, pool bytes shared vs unshared, decode
    TPOT at 16 and KV bytes per token per precision."""
    from ops.bench.engine.run import run_engine_bench

    results = run_engine_bench(settings_from(opts), quick=quick, skip=set(skip))
    _write_json(results, json_path)


@bench.command("queue")
@json_option
@click.option("--quick", is_flag=True, help="smaller sizes, for a smoke run")
@click.option(
    "--skip", multiple=True, type=click.Choice(["overhead", "publish", "scaling"]), help="skip a part"
)
@engine_options
def bench_queue_cmd(json_path: Path | None, quick: bool, skip: tuple[str, ...], **opts: Any) -> None:
    """Queue overhead of a 1-token job vs a direct engine call; 2 workers vs 1."""
    from ops.bench.queue.run import run_queue_bench

    results = run_queue_bench(settings_from(opts), quick=quick, skip=set(skip))
    _write_json(results, json_path)


@bench.command("serve")
@click.option(
    "--url",
    default=f"http://{DEFAULTS.api_host}:{DEFAULTS.api_port}",
    show_default=True,
    help="the API to load",
)
@click.option("--model", default=DEFAULTS.model, show_default=True)
@click.option("--concurrency", type=int, default=8, show_default=True)
@click.option("--duration", type=float, default=60.0, show_default=True, help="seconds")
@click.option("--max-tokens", type=int, default=32, show_default=True)
@click.option("--api-key", default="bench")
@click.option("--output", "csv_path", type=click.Path(dir_okay=False, path_type=Path), help="per-request CSV")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), help="summary JSON")
@click.option(
    "--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), help="PNG of TTFT/latency"
)
def bench_serve_cmd(
    url: str,
    model: str,
    concurrency: int,
    duration: float,
    max_tokens: int,
    api_key: str,
    csv_path: Path | None,
    json_path: Path | None,
    plot_path: Path | None,
) -> None:
    """Closed-loop load against a running API: throughput, p50/p99 TTFT, hit rate."""
    import asyncio

    from ops.bench.served.serve import plot, run_load, summarize, write_csv

    started = time.perf_counter()
    records = asyncio.run(run_load(url, model, concurrency, duration, max_tokens, api_key))
    summary = summarize(records, time.perf_counter() - started)
    for key, value in summary.items():
        click.echo(f"{key:>20}: {value:.3f}" if isinstance(value, float) else f"{key:>20}: {value}")
    if csv_path is not None:
        write_csv(csv_path, records)
    if plot_path is not None:
        plot(plot_path, records)
    if json_path is not None:
        json_path.write_text(json.dumps(summary, indent=2))


@bench.command("tiers")
@json_option
@click.option("--quick", is_flag=True, help="smaller sizes, for a smoke run")
@click.option(
    "--skip",
    multiple=True,
    type=click.Choice(["resume", "workload", "api", "no-tier"]),
    help="skip a part (no-tier: the workload's two set-ups without the Redis tier)",
)
@click.option(
    "--workload-reps",
    type=click.IntRange(1, 9),
    default=1,
    show_default=True,
    help="cache-aware / round-robin pairs run back to back; the ratios are the pairs' medians",
)
@click.option(
    "--workload",
    "kind",
    type=click.Choice(["closed", "realistic"]),
    default="closed",
    show_default=True,
    help="realistic: only the routing comparison on sessions with think time, lognormal lengths "
    "and pools smaller than the working set (ops/bench/tiers/realistic.py)",
)
@click.option(
    "--load",
    type=click.Choice(["overload", "moderate"]),
    default="overload",
    show_default=True,
    help="--workload realistic's arrival rate: overload (the pools' bound) or moderate (the same "
    "sessions arriving slower)",
)
@engine_options
def bench_tiers_cmd(
    json_path: Path | None,
    quick: bool,
    skip: tuple[str, ...],
    workload_reps: int,
    kind: str,
    load: str,
    **opts: Any,
) -> None:
    """Resume from Redis vs recompute; multi-turn hit rate and TTFT by routing policy."""
    from ops.bench.tiers.run import run_tier_bench

    if load != "overload" and kind != "realistic":
        raise click.BadParameter("applies to --workload realistic only", param_hint="--load")
    results = run_tier_bench(
        settings_from(opts), quick=quick, skip=set(skip), workload_reps=workload_reps, kind=kind, load=load
    )
    _write_json(results, json_path)


@bench.command("tier-dtype")
@json_option
@click.option("--quick", is_flag=True, help="16 continuations instead of 200, for a smoke run")
@engine_options
def bench_tier_dtype_cmd(json_path: Path | None, quick: bool, **opts: Any) -> None:
    """Compressed Redis tier (int8/fp16/bf16) vs exact: bytes, fetch rate, greedy-output quality."""
    from ops.bench.tiers.dtype import run_tier_dtype_bench

    results = run_tier_dtype_bench(settings_from(opts), quick=quick)
    _write_json(results, json_path)


@bench.command("quality")
@json_option
@click.option("--quick", is_flag=True, help="256 held-out tokens, 3 prompts, one timing round")
@engine_options
def bench_quality_cmd(json_path: Path | None, quick: bool, **opts: Any) -> None:
    """Each precision (fp32, bf16 weights, bf16 or int8 KV) vs HF fp32: perplexity ratio, greedy agreement,
    decode TPOT at 16 and KV bytes per token."""
    from ops.bench.quality.run import report, run_quality_bench

    results = run_quality_bench(settings_from(opts), quick=quick)
    click.echo(report(results))
    _write_json(results, json_path)


@bench.command("gemm")
@json_option
@click.option("--quick", is_flag=True, help="rows 1, 16 and 128 only, shorter timings")
@engine_options
def bench_gemm_cmd(json_path: Path | None, quick: bool, **opts: Any) -> None:
    """The model's linear shapes on kvferry's GEMM vs oneDNN-packed vs F.linear (CPU, --dtype)."""
    from ops.bench.engine.gemm import report, run_gemm_bench

    results = run_gemm_bench(settings_from(opts), quick=quick)
    click.echo(report(results))
    _write_json(results, json_path)


@bench.command("fleet")
@json_option
@click.option("--workers-list", default="2,8,32,64", show_default=True, help="fleet sizes, comma-separated")
@click.option("--jobs-per-worker", type=int, default=20, show_default=True)
@click.option("--max-jobs", type=int, default=1280, show_default=True, help="jobs per fleet at most")
@click.option("--concurrency", type=int, default=4, show_default=True, help="jobs at once per worker")
@click.option("--token-delay-s", type=float, default=0.02, show_default=True, help="simulated time per token")
@click.option("--max-tokens", type=int, default=16, show_default=True)
@click.option("--idle-s", type=float, default=5.0, show_default=True, help="the idle fleet's measured spell")
@click.option(
    "--route-digests", type=int, default=50_000, show_default=True, help="per worker, for route p99"
)
def bench_fleet_cmd(json_path: Path | None, workers_list: str, **opts: Any) -> None:
    """Redis cost per job as the fleet grows: N simulated-engine workers (no model), real job path."""
    from ops.bench.fleet.run import run_fleet_bench

    sizes = [int(n) for n in workers_list.split(",") if n.strip()]
    results = run_fleet_bench(sizes, **opts)
    _write_json(results, json_path)


@bench.command("durable-accept")
@json_option
@click.option("--submissions", type=int, default=400, show_default=True)
def bench_durable_accept_cmd(json_path: Path | None, submissions: int) -> None:
    """The durable accept's cost under Sentinel: p50 submit latency with the WAIT for a replica vs
    without, on the api's own submission path (a local primary, replica and sentinels)."""
    from ops.bench.queue.durable_accept import bench_accept

    result = bench_accept(submissions)
    click.echo(
        f"p50 submit: {result['without_wait_p50_ms']:.3f} ms without WAIT, "
        f"{result['with_wait_p50_ms']:.3f} ms with it: x{result['p50_ratio']:.2f}"
    )
    _write_json(result, json_path)


@bench.command("api-features")
@json_option
@click.option("--quick", is_flag=True, help="shorter outputs, fewer pairs and outputs, for a smoke run")
@engine_options
def bench_api_features_cmd(json_path: Path | None, quick: bool, **opts: Any) -> None:
    """Structured outputs, logprobs and n choices: each one's cost vs none, on the engine."""
    from ops.bench.features.run import run_api_features_bench

    results = run_api_features_bench(settings_from(opts), quick=quick)
    _write_json(results, json_path)
