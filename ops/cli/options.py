"""Shared CLI options: flags that override the KVFERRY_* settings."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from broker.defaults import DEFAULTS
from ops.settings import Settings
from workers.engine.model.dtype_names import DTYPES, KV_DTYPES, QUANTIZATIONS


def engine_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Flags that override KVFERRY_* settings for the engine."""
    options = [
        click.option("--model", help="'smollm2', a local HF model directory, or a .gguf file"),
        click.option("--served-model-name", help="the model name requests use (default: --model)"),
        click.option("--cache-size", help="KV pool byte budget, e.g. 512M, 2G"),
        click.option("--block-size", type=int, help=f"tokens per KV block ({DEFAULTS.block_size})"),
        click.option(
            "--max-num-seqs", type=int, help=f"most sequences in one step ({DEFAULTS.max_num_seqs})"
        ),
        click.option(
            "--max-num-batched-tokens",
            type=int,
            help=f"per-step token budget ({DEFAULTS.max_num_batched_tokens})",
        ),
        click.option("--max-model-len", type=int, help="context length cap (default: the model's)"),
        click.option("--no-prefix-caching", is_flag=True, default=False, help="disable block sharing"),
        click.option("--warm-cache-size", help="host-memory tier for evicted blocks, e.g. 256M; 0 = none"),
        click.option("--redis-cache-size", help="byte cap of the shared Redis KV tier, e.g. 2G; 0 = none"),
        click.option(
            "--warm-start-size",
            help="KV bytes a starting worker loads from the Redis tier (the hottest prefixes) "
            "before it takes work, e.g. 128M; 0 = none",
        ),
        click.option(
            "--session-ttl",
            "session_ttl_s",
            type=int,
            help=f"seconds an idle session lives ({DEFAULTS.session_ttl_s})",
        ),
        click.option(
            "--dtype",
            type=click.Choice(DTYPES),
            help="weights and GEMMs (auto: bf16 where the CPU has AVX512-BF16 or AMX, or on CUDA; else fp32)",
        ),
        click.option(
            "--kv-cache-dtype",
            type=click.Choice(KV_DTYPES),
            help="the hot KV pool's dtype (auto: as --dtype; int8: a scale per token and head, opt-in)",
        ),
        click.option(
            "--quantization",
            type=click.Choice(QUANTIZATIONS),
            help="the decoder linears' weights: int8 = weight-only, per-channel (computes in bf16)",
        ),
        click.option(
            "--kv-tier-dtype",
            type=click.Choice(["exact", "int8", "fp16", "bf16"]),
            help="how the Redis tier stores blocks (exact; int8/fp16/bf16 are lossy: see docs/benchmarks.md)",
        ),
        click.option(
            "--kv-write-queue-size", help="KV bytes waiting for Redis, e.g. 256M; full: oldest dropped"
        ),
        click.option(
            "--host-heap-reserve",
            help="host memory a worker faults in at start and keeps for Redis reads, e.g. 256M; 0 = none",
        ),
        click.option(
            "--kv-write-defer",
            "kv_write_defer_s",
            type=float,
            help=f"how long the KV writer may wait for an idle engine ({DEFAULTS.kv_write_defer_s} s)",
        ),
        click.option(
            "--first-token-hold",
            "first_token_hold_s",
            type=float,
            help="how long the engine's next step may wait for a job's first token to be published "
            f"({DEFAULTS.first_token_hold_s} s; 0 = never)",
        ),
        click.option(
            "--max-prefill-tokens-with-decodes",
            type=int,
            help="prompt tokens per step while sequences decode (default: only the step budget)",
        ),
        click.option(
            "--prefill-batch-hold",
            "prefill_batch_hold",
            type=float,
            help="while others decode, new prompts wait to be prefilled together, up to this many "
            "times a full batch's predicted prefill, counting the prompt tokens not cached "
            f"({DEFAULTS.prefill_batch_hold}; 0 = admit at once)",
        ),
        click.option(
            "--interactive-batch-step",
            "interactive_batch_step",
            type=float,
            help="while interactive requests flow, a step carrying batch sequences costs at most this "
            f"many times the predicted step without them ({DEFAULTS.interactive_batch_step}; 0 = no limit)",
        ),
        click.option(
            "--interactive-batch-duty",
            "interactive_batch_duty",
            type=float,
            help="while interactive requests flow, the share of time steps carrying only batch "
            f"sequences may take: an idle gap follows each ({DEFAULTS.interactive_batch_duty}; 1 = no gap)",
        ),
        click.option("--torch-threads", type=int, help="torch intra-op threads"),
        click.option("--cache-dir", type=click.Path(path_type=Path), help="converted-model cache"),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def settings_from(opts: dict[str, Any]) -> Settings:
    """Settings from the environment, overridden by the flags in `opts` that name a setting (a
    flag's destination is the setting's name): those are popped, the rest are left for the command.
    A new setting's flag is then one click.option line; nothing here changes."""
    overrides = {k: opts.pop(k) for k in [*opts] if k in Settings.model_fields}
    if opts.pop("no_prefix_caching", False):
        overrides["enable_prefix_caching"] = False
    return Settings.from_env(**overrides)


def build_engine(settings: Settings) -> Any:
    from workers.engine import factory  # torch import only for commands that need it

    return factory.build_engine(settings.engine_config(), cache_dir=settings.cache_dir)


def service_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--redis-url", help="Redis for queues, results and token streams")(fn)


def tenant_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Flags of the commands that run the API: tenants and their limits, the tool-call parser."""
    fn = click.option(
        "--tool-call-parser",
        type=click.Choice(["hermes"]),
        help="how the served model writes tool calls (as vLLM's flag); hermes: <tool_call> JSON",
    )(fn)
    fn = click.option(
        "--prefetch-hints/--no-prefetch-hints",
        default=None,
        help="a session routed to a new worker: that worker loads its blocks while the job waits",
    )(fn)
    fn = click.option(
        "--tenant-max-jobs", type=int, help="unfinished jobs per tenant at once, over it 429 (0 = no cap)"
    )(fn)
    fn = click.option(
        "--files-dir",
        type=click.Path(file_okay=False, path_type=Path),
        help="where /v1/files keeps contents, shared by every api replica [CACHE_DIR/files]",
    )(fn)
    fn = click.option(
        "--dispatch-headroom", type=int, help="seats per worker kept from parked and batch work"
    )(fn)
    fn = click.option("--fair-quota", type=int, help="released jobs per unit of weight a tenant always gets")(
        fn
    )
    return click.option(
        "--api-keys-file",
        type=click.Path(dir_okay=False, path_type=Path),
        help="one 'key tenant [weight]' per line (# comments); re-read when it changes",
    )(fn)
