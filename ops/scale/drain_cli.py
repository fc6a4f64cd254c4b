"""`kvferry worker --drain --name N`: the `kvferry_drain` broadcast to that one worker
(workers/process/control.py); it drains and exits (workers/process/drain.py)."""

from __future__ import annotations

import click

from broker.celery_app import make_celery
from ops.settings import Settings


def send_drain(settings: Settings, timeout_s: float = 5.0) -> str:
    if not settings.worker_name:
        raise click.UsageError("--drain needs --name (NAME, or NAME@host)")
    from workers.process.main import node_name

    name = settings.worker_name
    node = name if "@" in name else node_name(name)
    app = make_celery(settings.broker_config())
    # No reply to wait for: the command ends its worker's consumer (as Celery's own `shutdown`).
    app.control.broadcast("kvferry_drain", destination=[node], reply=False)
    return f"asked {node} to drain (it finishes its running jobs within its --drain-timeout, then exits)"
