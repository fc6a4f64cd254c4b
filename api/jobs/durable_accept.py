"""A durable accept under Sentinel: the job's records reach a replica before the api answers.

Redis replicates asynchronously, so a primary SIGKILLed right after a write may take it along;
the replica Sentinel promotes then never saw the job. `WAIT n ms` blocks until n replicas have
acknowledged every write *this connection* made before it, so the write and the WAIT must share a
connection: here they are one non-transactional pipeline (one connection, one round trip) of a
script that writes the job's metadata, its message copy and pending entry (the durable record
workers/jobs/lost_messages.py resends from) and its queue message, atomically as the MULTI of
the plain path does, followed by the WAIT. Celery's own producer connection is never involved.

Short of n replicas within the timeout (the replica is down, or is still the old primary coming
back after a failover) the job is accepted anyway and counted: with the only replica gone a
refusal would turn every failover into an outage, while the job is then as safe as without HA
(the primary's AOF). docs/operations.md ("HA") says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis

# KEYS: meta, message copy, pending set, queue. ARGV: ttl, message, now, job id, payload,
# then the meta hash's field/value pairs.
_WRITE = """
redis.call('HSET', KEYS[1], unpack(ARGV, 6))
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[4])
redis.call('LPUSH', KEYS[4], ARGV[5])
return 1
"""


async def write_and_wait(
    client: aioredis.Redis,
    keys: tuple[str, str, str, str],
    fields: dict[Any, Any],
    ttl_s: int,
    message: str,
    now: float,
    job_id: str,
    payload: str | bytes,
    replicas: int,
    wait_ms: int,
    also: Callable[[Any], None] | None = None,
) -> int:
    """Write the job's records and WAIT on the same connection; the replicas that acknowledged.
    `also` queues more writes on the pipeline first (the sweeps' delivery records), so the WAIT
    covers them too."""
    flat: list[Any] = [x for pair in fields.items() for x in pair]
    pipe = client.pipeline(transaction=False)
    if also is not None:
        also(pipe)
    pipe.eval(_WRITE, 4, *keys, ttl_s, message, repr(now), job_id, payload, *flat)
    pipe.execute_command("WAIT", replicas, wait_ms)
    replies = await pipe.execute()
    return int(replies[-1])
