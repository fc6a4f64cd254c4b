"""The `kvferry` command line: one CLI for everything."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from broker.errors import KvferryError
from ops.settings import Settings


def engine_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Flags that override KVFERRY_* settings for the engine."""
    options = [
        click.option("--model", help="'smollm2', a local HF model directory, or a .gguf file"),
        click.option("--served-model-name", help="the model name requests use (default: --model)"),
        click.option("--cache-size", help="KV pool byte budget, e.g. 512M, 2G"),
        click.option("--block-size", type=int, help="tokens per KV block (default 16)"),
        click.option("--max-num-seqs", type=int, help="most sequences in one step (default 32)"),
        click.option("--max-num-batched-tokens", type=int, help="per-step token budget (default 1024)"),
        click.option("--max-model-len", type=int, help="context length cap (default: the model's)"),
        click.option("--no-prefix-caching", is_flag=True, default=False, help="disable block sharing"),
        click.option("--torch-threads", type=int, help="torch intra-op threads"),
        click.option("--cache-dir", type=click.Path(path_type=Path), help="converted-model cache"),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def settings_from(opts: dict[str, Any]) -> Settings:
    no_caching = opts.pop("no_prefix_caching", False)
    keys = (
        "model",
        "served_model_name",
        "cache_size",
        "block_size",
        "max_num_seqs",
        "max_num_batched_tokens",
        "max_model_len",
        "torch_threads",
        "cache_dir",
    )
    overrides = {k: opts.pop(k, None) for k in keys}
    if no_caching:
        overrides["enable_prefix_caching"] = False
    return Settings.from_env(**overrides)


def build_engine(settings: Settings) -> Any:
    from workers.engine.llm_engine import LLMEngine  # torch import only for commands that need it

    return LLMEngine(settings.engine_config(), cache_dir=settings.cache_dir)


@click.group()
def main() -> None:
    """kvferry: LLM jobs through a durable queue, over a shared, paged KV cache."""


@main.command("run-batch")
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


def service_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--redis-url", help="Redis for queues, results and token streams")(fn)
    return fn


@main.command("worker")
@click.option("--name", "worker_name", help="worker name (node name becomes NAME@host)")
@click.option("--concurrency", "worker_concurrency", type=int, help="jobs at once, batched together (32)")
@click.option("--preload", is_flag=True, help="build the engine now instead of on the first job")
@click.option("--loglevel", default="INFO")
@service_options
@engine_options
def worker_cmd(preload: bool, loglevel: str, **opts: Any) -> None:
    """A Celery worker (threads pool) feeding one engine: consumes the shared queue and its own."""
    from workers.worker_main import run_worker

    service = {k: opts.pop(k, None) for k in ("worker_name", "worker_concurrency", "redis_url")}
    settings = settings_from(opts).with_overrides(**service)
    run_worker(
        settings.broker_config(),
        settings.engine_config(),
        settings.cache_dir,
        name=settings.worker_name,
        concurrency=settings.worker_concurrency,
        loglevel=loglevel,
        preload=preload,
    )


@main.group()
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


if __name__ == "__main__":
    sys.exit(main())
