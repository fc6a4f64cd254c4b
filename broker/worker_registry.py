"""Who is alive: workers' heartbeats and queue depths, read from Redis."""

from __future__ import annotations

from typing import Any

import redis

from broker import keys, priority
from broker.codec import CodecError, decode, encode
from broker.messages import WorkerStatus

HEARTBEAT_FIELD = "status"
# The worker's maintenance figures (workers/jobs/maintenance.py MaintenanceFigures, JSON), beside
# its status in the same hash and the same HSET: `kvferry bench fleet` reads them.
MAINTENANCE_FIELD = "maintenance"


def encode_status(status: WorkerStatus) -> bytes:
    return encode(status)


def decode_status(raw: bytes | str) -> WorkerStatus:
    """Raises CodecError for anything but a WorkerStatus (bytes that are not JSON included)."""
    return decode(raw, WorkerStatus)


def live_workers(client: redis.Redis) -> list[WorkerStatus]:
    """Workers whose heartbeat has not expired, by name."""
    names: Any = client.smembers(keys.WORKERS)
    out = []
    for raw_name in sorted(names):
        raw = client.hget(keys.worker_heartbeat(raw_name.decode()), HEARTBEAT_FIELD)
        if raw is not None:
            try:
                out.append(decode_status(raw))
            except CodecError:
                continue  # a heartbeat from another kvferry version: not ours to read
    return out


def queue_depths(client: redis.Redis, workers: list[WorkerStatus]) -> dict[str, int]:
    """Messages waiting per queue (the shared one and each live worker's own), every priority
    band's list (broker/priority.py) summed."""
    names = [keys.SHARED_QUEUE, *(w.queue for w in workers)]
    pipe = client.pipeline(transaction=False)
    for name in names:
        for key in priority.queue_keys(name):
            pipe.llen(key)
    lengths = [int(n) for n in pipe.execute()]
    bands = len(priority.PRIORITY_STEPS)
    return {q: sum(lengths[i * bands : (i + 1) * bands]) for i, q in enumerate(names)}
