"""`kvferry bench sessions` (the run itself is ops/bench/sessions/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ops.cli.engine import _write_json, bench, json_option
from ops.cli.options import engine_options, settings_from

_path = click.Path(dir_okay=False, path_type=Path)


@bench.command("sessions")
@click.option(
    "--base-url", help="an OpenAI chat server (kvferry, vLLM, llama-server...), with or without /v1"
)
@click.option("--api-key", default="", help="sent as a Bearer token")
@json_option
@click.option("--csv", "csv_path", type=_path, help="one row per request")
@click.option("--png", "png_path", type=_path, help="TTFT p95 by turn and by N")
@click.option("--sessions", type=int, default=8, show_default=True, help="concurrent sessions (one level)")
@click.option("--turns", type=int, default=8, show_default=True)
@click.option("--output-tokens", type=int, default=32, show_default=True, help="tokens asked per reply")
@click.option("--think-mean-s", type=float, default=1.0, show_default=True, help="mean think time")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--system-prompts", type=int, default=4, show_default=True, help="shared system prompts")
@click.option("--find-capacity", is_flag=True, help="raise N until an SLO is missed; report the largest met")
@click.option("--slo-ttft", type=float, default=2.0, show_default=True, help="p95 TTFT SLO, seconds")
@click.option("--slo-tpot", type=float, default=0.25, show_default=True, help="p95 TPOT SLO, seconds")
@click.option("--max-sessions", type=int, default=64, show_default=True, help="--find-capacity's top N")
@click.option(
    "--max-level-s", type=float, default=300.0, show_default=True, help="a level running longer is missed"
)
@click.option("--workers", type=int, help="move mode: start a kvferry stack of this many workers")
@click.option(
    "--move-after", type=int, default=2, show_default=True, help="move mode: turn K before the move"
)
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), help="move mode: stack logs")
@engine_options
def bench_sessions_cmd(
    base_url: str | None,
    json_path: Path | None,
    csv_path: Path | None,
    png_path: Path | None,
    workers: int | None,
    move_after: int,
    run_dir: Path | None,
    **opts: Any,
) -> None:
    """Multi-turn sessions against any OpenAI chat server: TTFT/TPOT by turn, and with
    --find-capacity the sessions at SLO. Without --base-url and with --workers: kvferry's forced
    session move (each session changes worker after turn --move-after). With --base-url, --model
    is the model name to ask for (default: the server's first)."""
    from ops.bench.sessions.driver import Config, run_bench
    from ops.bench.sessions.report import plot, write_csv

    if base_url and workers:
        raise click.UsageError("--base-url measures a running server; --workers starts one: pick one")
    if not base_url and not workers:
        raise click.UsageError("give --base-url (a running server) or --workers (move mode)")
    names = ("api_key", "sessions", "turns", "output_tokens", "think_mean_s", "seed", "system_prompts",
             "find_capacity", "max_sessions", "max_level_s")  # fmt: skip
    cfg = Config(
        base_url=base_url or "", model=opts["model"] if base_url else None,
        slo_ttft_s=opts.pop("slo_ttft"), slo_tpot_s=opts.pop("slo_tpot"), **{k: opts.pop(k) for k in names},
    )  # fmt: skip
    log = lambda m: click.echo(m, err=True)  # noqa: E731
    try:
        if base_url:
            result = run_bench(cfg, log)
        else:
            from ops.bench.sessions.move import run_move

            result = run_move(settings_from(opts), workers or 2, move_after, cfg, run_dir, log)
    except (RuntimeError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    doc = result.doc
    if "sessions_at_slo" in doc:
        click.echo(f"sessions at SLO ({doc['server']}): {doc['sessions_at_slo']}")
    for key in (
        "ttft_p95_turn8_vs_turn1",
        "ttft_p95_last_vs_turn1",
        "moved_turn_ttft_ratio",
        "moved_vs_recompute",
    ):
        if doc.get(key) is not None:
            click.echo(f"{key}: {doc[key]:.3f}")
    if csv_path is not None:
        write_csv(csv_path, result.records)
    if png_path is not None:
        plot(png_path, doc)
    _write_json(doc, json_path)
