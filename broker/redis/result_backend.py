"""Celery's Redis result backends for a process that sends jobs and never waits on Celery's
results: the api follows each job's own event stream (broker/jobs/events.py) instead.

Celery's Redis backend subscribes to a task's result channel as the task is sent (so that
AsyncResult.get() could wake on it) and unsubscribes when the AsyncResult is collected: two
pubsub commands a job (`kvferry bench queue`'s publish part compares the two backends:
docs/benchmarks.md), and the results of every job the
process sent arrive on a connection nobody reads, until Redis' pubsub output limit drops it. Here
sending subscribes to nothing. Reading a task's state (get_task_meta) works as before."""

from __future__ import annotations

from typing import Any

from celery.backends.redis import RedisBackend, SentinelBackend


class SendOnlyRedisBackend(RedisBackend):
    def on_task_call(self, producer: Any, task_id: str) -> None:
        return None

    def remove_pending_result(self, result: Any) -> Any:
        return result  # nothing was subscribed for it


class SendOnlySentinelBackend(SentinelBackend):
    on_task_call = SendOnlyRedisBackend.on_task_call
    remove_pending_result = SendOnlyRedisBackend.remove_pending_result


def send_only_url(url: str) -> str:
    """The result_backend setting for `url` with the backend above ("module:Class+url", which
    Celery reads as that class on that URL); other schemes as they are."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in ("redis", "rediss", "unix"):
        return f"{__name__}:SendOnlyRedisBackend+{url}"
    if scheme == "sentinel":
        return f"{__name__}:SendOnlySentinelBackend+{url}"
    return url
