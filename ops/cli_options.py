"""Shared CLI options: flags that override the KVFERRY_* settings."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

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
        click.option("--warm-cache-size", help="host-memory tier for evicted blocks, e.g. 256M; 0 = none"),
        click.option("--redis-cache-size", help="byte cap of the shared Redis KV tier, e.g. 2G; 0 = none"),
        click.option("--session-ttl", "session_ttl_s", type=int, help="seconds an idle session lives (3600)"),
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
        "warm_cache_size",
        "redis_cache_size",
        "session_ttl_s",
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


def service_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--redis-url", help="Redis for queues, results and token streams")(fn)


def tenant_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Flags of the commands that run the API: tenants and their limits."""
    fn = click.option(
        "--tenant-max-jobs", type=int, help="unfinished jobs per tenant at once, over it 429 (0 = no cap)"
    )(fn)
    return click.option(
        "--api-keys-file",
        type=click.Path(dir_okay=False, path_type=Path),
        help="one 'key tenant' per line (# comments); re-read when it changes",
    )(fn)
