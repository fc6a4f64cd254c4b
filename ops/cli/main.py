"""The `kvferry` command line: one CLI for everything."""

from __future__ import annotations

import sys

import click

from ops.cli.batch import batch_cmd
from ops.cli.bench_autoscale import bench_autoscale_cmd  # noqa: F401  (registers `bench autoscale`)
from ops.cli.bench_batch import bench_batch_cmd  # noqa: F401  (registers `bench batch`)
from ops.cli.bench_lm_eval import bench_lm_eval_cmd  # noqa: F401  (registers `bench lm-eval`)
from ops.cli.bench_responses import bench_responses_cmd  # noqa: F401  (registers `bench responses`)
from ops.cli.bench_served import bench_served_decode_cmd  # noqa: F401  (`bench served-decode`)
from ops.cli.bench_sessions import bench_sessions_cmd  # noqa: F401  (registers `bench sessions`)
from ops.cli.chaos import chaos_cmd
from ops.cli.engine import bench, run_batch_cmd
from ops.cli.service import api_cmd, ping_cmd, preload_cmd, serve_cmd, stats_cmd, submit_cmd, worker_cmd
from ops.settings import SettingsError


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except SettingsError as exc:  # a bad KVFERRY_* value or flag: one line, not a traceback
            raise click.ClickException(str(exc)) from exc


@click.group(cls=_Group)
def main() -> None:
    """kvferry: LLM jobs through a durable queue, over a shared, paged KV cache."""


for command in (
    run_batch_cmd,
    bench,
    worker_cmd,
    api_cmd,
    serve_cmd,
    submit_cmd,
    ping_cmd,
    stats_cmd,
    preload_cmd,
    chaos_cmd,
    batch_cmd,
):
    main.add_command(command)


if __name__ == "__main__":
    sys.exit(main())
