"""The fleet as Redis shows it: known workers, their heartbeats, and how deep each queue is.
An async twin of broker/worker_registry.py, whose field name and decoder it uses."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from api.lua import Script, affixes
from broker import keys, priority
from broker.codec import CodecError
from broker.messages import WorkerStatus
from broker.worker_registry import HEARTBEAT_FIELD, decode_status


@dataclass(frozen=True, slots=True)
class WorkerView:
    name: str
    live: bool  # its heartbeat key has not expired
    status: WorkerStatus | None  # None when dead or its heartbeat is unreadable


_WORKERS = Script(__file__, "workers")  # every announced worker with its heartbeat, one round trip
_BEAT = affixes(keys.worker_heartbeat)


async def workers(client: aioredis.Redis) -> list[WorkerView]:
    """Every worker that ever announced itself (keys.WORKERS), live or not."""
    reply: Any = await _WORKERS(client, [keys.WORKERS], [*_BEAT, HEARTBEAT_FIELD])
    beats = {reply[i].decode(): reply[i + 1] for i in range(0, len(reply), 2)}
    return [WorkerView(name, beats[name] is not None, _status(beats[name])) for name in sorted(beats)]


class FleetCache:
    """The fleet as one api process last read it, for at most `ttl_s`: routing reads every
    worker's heartbeat once per period, not once per job (heartbeats are that old anyway, and
    api/routing/recent.py's RecentRoutes counts the jobs routed since)."""

    def __init__(self, ttl_s: float = 1.0) -> None:
        self.ttl_s = ttl_s
        self._read_at = -1e9
        self._views: list[WorkerView] = []

    async def workers(self, client: aioredis.Redis) -> list[WorkerView]:
        now = time.monotonic()
        if now - self._read_at >= self.ttl_s:
            self._views, self._read_at = await workers(client), now
        return self._views


def _status(raw: bytes | None) -> WorkerStatus | None:
    if raw is None:
        return None
    try:
        return decode_status(raw)
    except CodecError:  # another kvferry version's, or not even JSON: alive, but unreadable
        return None


async def queue_depths(client: aioredis.Redis, worker_names: list[str]) -> dict[str, int]:
    """Messages waiting in the shared queue and in each worker's own queue (LLEN of every
    priority band's list, broker/priority.py, summed)."""
    queues = [keys.SHARED_QUEUE, *(keys.worker_queue(n) for n in worker_names)]
    pipe = client.pipeline(transaction=False)
    for q in queues:
        for key in priority.queue_keys(q):
            pipe.llen(key)
    lengths = [int(n) for n in await pipe.execute()]
    bands = len(priority.PRIORITY_STEPS)
    return {q: sum(lengths[i * bands : (i + 1) * bands]) for i, q in enumerate(queues)}
