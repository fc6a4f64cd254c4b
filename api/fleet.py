"""The fleet as Redis shows it: known workers, their heartbeats, and how deep each queue is.
An async twin of broker/worker_registry.py, whose field name and decoder it uses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from broker import keys
from broker.codec import CodecError
from broker.messages import WorkerStatus
from broker.worker_registry import HEARTBEAT_FIELD, decode_status


@dataclass(frozen=True, slots=True)
class WorkerView:
    name: str
    live: bool  # its heartbeat key has not expired
    status: WorkerStatus | None  # None when dead or its heartbeat is unreadable


async def workers(client: aioredis.Redis) -> list[WorkerView]:
    """Every worker that ever announced itself (keys.WORKERS), live or not."""
    members: Any = await client.smembers(keys.WORKERS)
    names = sorted(n.decode() for n in members)
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.hget(keys.worker_heartbeat(name), HEARTBEAT_FIELD)
    beats: list[Any] = await pipe.execute() if names else []
    return [WorkerView(name, raw is not None, _status(raw)) for name, raw in zip(names, beats, strict=True)]


def _status(raw: bytes | None) -> WorkerStatus | None:
    if raw is None:
        return None
    try:
        return decode_status(raw)
    except CodecError:  # another kvferry version's, or not even JSON: alive, but unreadable
        return None


async def queue_depths(client: aioredis.Redis, worker_names: list[str]) -> dict[str, int]:
    """Messages waiting in the shared queue and in each worker's own queue (LLEN)."""
    queues = [keys.SHARED_QUEUE, *(keys.worker_queue(n) for n in worker_names)]
    pipe = client.pipeline(transaction=False)
    for q in queues:
        pipe.llen(q)
    return dict(zip(queues, (int(n) for n in await pipe.execute()), strict=True))
