"""The `kvferry` command line: one CLI for everything."""

from __future__ import annotations

import sys

import click

from ops.chaos_command import chaos_cmd
from ops.commands_engine import bench, run_batch_cmd
from ops.commands_service import api_cmd, ping_cmd, preload_cmd, serve_cmd, stats_cmd, submit_cmd, worker_cmd


@click.group()
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
):
    main.add_command(command)


if __name__ == "__main__":
    sys.exit(main())
