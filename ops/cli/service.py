"""Queue-service commands: worker, api, serve, submit, ping, stats."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import click

from broker.defaults import DEFAULTS
from ops.cli.options import engine_options, service_options, settings_from, tenant_options
from ops.settings import Settings


@click.command("worker")
@click.option("--name", "worker_name", help="worker name (node name becomes NAME@host)")
@click.option(
    "--concurrency",
    "worker_concurrency",
    type=int,
    help=f"jobs at once, batched together ({DEFAULTS.worker_concurrency})",
)
@click.option("--preload", is_flag=True, help="build the engine now instead of on the first job")
@click.option("--loglevel", default="INFO")
@click.option("--debug-slow-step-s", type=float, hidden=True, help="test hook: prefill steps sleep more")
@click.option("--debug-crash-step", type=int, hidden=True, help="test hook: the N-th step raises once")
@click.option("--kv-redis-url", help="Redis for the KV tier's block packs (default: --redis-url)")
@click.option("--tenant-kv-quota", help="session-pinned bytes per tenant in the Redis tier, e.g. 512M")
@click.option(
    "--engine",
    type=click.Choice(["torch", "simulated"]),
    help="simulated: the load-test engine, no model (with --model simulated only; docs/operations.md)",
)
@click.option("--simulated-token-delay-s", type=float, help="the simulated engine's time per token")
@click.option(
    "--drain-timeout",
    "drain_timeout_s",
    type=float,
    help=f"told to stop: running jobs get this long, then are handed back ({DEFAULTS.drain_timeout_s:g}s)",
)
@click.option("--drain", is_flag=True, help="tell the running worker --name to drain and exit, then return")
@service_options
@engine_options
def worker_cmd(preload: bool, loglevel: str, drain: bool, **opts: Any) -> None:
    """A Celery worker (threads pool) feeding one engine: consumes the shared queue and its own.
    SIGTERM (or --drain from another shell) drains it: docs/operations.md#scale-in-without-loss."""
    from workers.process.main import run_worker

    settings = settings_from(opts)
    if drain:
        from ops.scale.drain_cli import send_drain

        click.echo(send_drain(settings))
        return
    run_worker(
        settings.broker_config(),
        settings.engine_config(),
        settings.cache_dir,
        name=settings.worker_name,
        concurrency=settings.worker_concurrency,
        loglevel=loglevel,
        preload=preload,
        tiers=settings.tier_config(),
        kv_redis_url=settings.kv_redis_url,
        simulated=simulated_engine(settings),
        drain_timeout_s=settings.drain_timeout_s,
    )


def simulated_engine(settings: Settings) -> Any:
    """The simulated engine's settings when asked for by name, else None; refused otherwise."""
    from workers.loop.simulated import SimulatedEngineRefusedError, choose

    try:
        return choose(
            settings.engine, settings.model, settings.simulated_token_delay_s, settings.default_max_tokens
        )
    except SimulatedEngineRefusedError as exc:
        raise click.ClickException(str(exc)) from exc


@click.command("api")
@click.option("--host", "api_host", help=f"bind address ({DEFAULTS.api_host})")
@click.option("--port", "api_port", type=int, help=f"port ({DEFAULTS.api_port})")
@click.option("--kv-redis-url", help="the KV tier's Redis, for session pins (default: --redis-url)")
@tenant_options
@service_options
@engine_options
def api_cmd(**opts: Any) -> None:
    """The OpenAI-compatible HTTP API (FastAPI on uvicorn)."""
    from ops.stack.api_server import run_api

    run_api(settings_from(opts))


@click.command("serve")
@click.option("--workers", "num_workers", type=int, default=2, show_default=True)
@click.option("--port", "api_port", type=int, help=f"API port ({DEFAULTS.api_port})")
@click.option("--flower-port", type=int, help=f"Flower port ({DEFAULTS.flower_port})")
@click.option("--demo", is_flag=True, help="run a demo conversation through the queue once ready")
@click.option("--exit-after-demo", is_flag=True, help="stop everything after the demo")
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="logs, Redis data and stack.json (URLs, secrets; 0600) [CACHE_DIR/run]",
)
@click.option("--kv-redis-url", help="the KV tier's Redis (default: one started here, capped)")
@click.option(
    "--kv-shards", type=int, help="the KV tier on a local Redis Cluster of N primaries (0: one Redis)"
)
@click.option("--ha", is_flag=True, help="the queue Redis under Sentinel: a primary, a replica, 3 sentinels")
@click.option("--autoscale", metavar="MIN:MAX", help="start and drain workers by kvferry_desired_workers")
@tenant_options
@service_options
@engine_options
def serve_cmd(
    num_workers: int,
    demo: bool,
    exit_after_demo: bool,
    run_dir: Path | None,
    ha: bool,
    autoscale: str | None,
    **opts: Any,
) -> None:
    """The whole stack on this machine: two Redis (queue; KV cache), N workers, the API, Flower
    (basic auth). Passwords are generated; they and the URLs go to RUN_DIR/stack.json. Ctrl-C stops it.
    --autoscale MIN:MAX: MIN workers first, then as many as the scaling policy asks (ops/scale/)."""
    from ops.scale.autoscaler import LocalAutoscaler, desired_from_metrics, parse_bounds
    from ops.stack.stack import Stack

    settings = settings_from(opts)
    bounds = None
    if autoscale:
        try:
            bounds = parse_bounds(autoscale)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--autoscale") from exc
        settings = settings.with_overrides(scale_min_workers=bounds[0], scale_max_workers=bounds[1])
        num_workers = bounds[0]
    stack = Stack(settings, num_workers, run_dir=run_dir, ha=ha)
    # the workers are sessions of their own (ops/stack/stack.py): a hangup or a SIGTERM of this
    # process reaches them only through the stack's stop, as Ctrl-C does
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop_as_ctrl_c)
    click.echo(f"run directory: {stack.run_dir}")
    with stack:
        click.echo(f"URLs and secrets: {stack.stack_file} (mode 0600); waiting for the workers...")
        stack.wait_ready()
        click.echo(stack.banner())
        if demo or exit_after_demo:
            from ops.demo import run_demo

            run_demo(stack.api_url, settings.served_model, stack.flower_url, settings.api_key)
        if exit_after_demo:
            return
        if bounds is None:
            stack.wait()
            return
        scaler = LocalAutoscaler(
            stack, bounds, lambda: desired_from_metrics(stack.api_url, settings.metrics_token)
        )
        try:
            stack.wait(tick=scaler.tick)
        finally:
            scaler.close()


def _stop_as_ctrl_c(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@click.command("submit")
@click.argument("prompt")
@click.option("--chat/--completion", default=True, help="send as a chat message (default) or raw prompt")
@click.option("--system", help="system prompt (chat)")
@click.option("--max-tokens", type=int, default=64, show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--session-id", help="conversation id (cache-aware routing)")
@click.option("--queue", help="send to this queue instead of the shared one")
@click.option("--model", help="model name (default: KVFERRY_SERVED_MODEL_NAME or KVFERRY_MODEL)")
@service_options
def submit_cmd(
    prompt: str,
    chat: bool,
    system: str | None,
    max_tokens: int,
    temperature: float,
    session_id: str | None,
    queue: str | None,
    model: str | None,
    redis_url: str | None,
) -> None:
    """Send one job straight to the queue (Celery, no HTTP) and print its tokens as they stream."""
    from ops.queue_client import submit_and_follow

    settings = Settings.from_env(redis_url=redis_url)
    result = submit_and_follow(
        settings,
        prompt,
        chat=chat,
        system=system,
        max_tokens=max_tokens,
        temperature=temperature,
        session_id=session_id,
        queue=queue,
        model=model or settings.served_model,
        out=sys.stdout,
    )
    u = result.usage
    click.echo(
        f"\n[{result.finish_reason}] {u.prompt_tokens} prompt tokens ({u.cached_tokens} cached), "
        f"{u.completion_tokens} generated on {result.worker}; ttft {result.ttft_s * 1000:.0f} ms, "
        f"total {result.latency_s * 1000:.0f} ms",
        err=True,
    )


@click.command("ping")
@click.option("--timeout", type=float, default=2.0, show_default=True)
@service_options
def ping_cmd(timeout: float, redis_url: str | None) -> None:
    """Workers alive (heartbeat and a Celery ping), their queues, load and pool figures."""
    from ops.queue_client import ping

    report = ping(Settings.from_env(redis_url=redis_url), timeout)
    click.echo(report.render())
    if not report.workers:
        raise SystemExit(1)


@click.command("stats")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--kv-redis-url", help="the KV tier's Redis (default: --redis-url)")
@service_options
def stats_cmd(as_json: bool, redis_url: str | None, kv_redis_url: str | None) -> None:
    """Per-worker memory breakdown and prefix-cache hit rates; the Redis tier's counters and pins.

    --json prints {"workers": [...], "redis_tier": {...}}: redis_tier has hits, misses, bytes_read,
    bytes_written, pinned_bytes_by_tenant and orphan_pins (pins of no session: 0 unless a bug)."""
    from ops.queue_client import redis_tier_report, worker_stats

    settings = Settings.from_env(redis_url=redis_url, kv_redis_url=kv_redis_url)
    rows = worker_stats(settings)
    tier = redis_tier_report(settings)
    if as_json:
        click.echo(json.dumps({"workers": rows, "redis_tier": tier}, indent=2))
        return
    if not rows:
        click.echo("no live workers")
    for row in rows:
        click.echo(" ".join(f"{k}={v}" for k, v in row.items()))
    click.echo("redis tier: " + " ".join(f"{k}={v}" for k, v in tier.items() if k != "models"))


@click.command("preload")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--tenant",
    default="",
    help="the tenant whose requests reuse the blocks (its name in KVFERRY_API_KEYS; '' = auth off)",
)
@service_options
def preload_cmd(path: Path, tenant: str, redis_url: str | None) -> None:
    """Compute and pin common prompt templates (system prompts) in the shared Redis KV tier.
    Blocks are scoped by tenant: only the named tenant's requests reuse them."""
    from ops.queue_client import preload

    count = preload(Settings.from_env(redis_url=redis_url), path, sys.stdout, tenant=tenant)
    click.echo(f"{count} template(s) preloaded", err=True)
