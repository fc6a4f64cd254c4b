"""Which queue a job goes to. For now every job takes the shared queue; cache-aware routing (a
session's last worker, the longest advertised prefix match) replaces this function later."""

from __future__ import annotations

from broker import keys


def choose_queue(session_id: str | None) -> tuple[str, str]:
    """(queue name, reason): the reason is recorded in the job's metadata."""
    return keys.SHARED_QUEUE, "shared"
