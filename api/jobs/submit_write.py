"""A job's submission in Redis: one script writes the job's metadata, its message copy and pending
entry (the record workers/jobs/lost_messages.py resends from), the sweeps' delivery records
(broker/jobs/delivery.py) and its queue message, all or nothing; under Sentinel a WAIT follows on
the same connection, so the api answers only once a replica holds the job.

Redis replicates asynchronously, so a primary SIGKILLed right after a write may take it along;
the replica Sentinel promotes then never saw the job. `WAIT n ms` blocks until n replicas have
acknowledged every write *this connection* made before it, so the write and the WAIT share one
non-transactional pipeline (one connection, one round trip). Celery's own producer connection is
never involved.

Short of n replicas within the timeout (the replica is down, or is still the old primary coming
back after a failover) the job is accepted anyway and counted: with the only replica gone a
refusal would turn every failover into an outage, while the job is then as safe as without HA
(the primary's AOF). docs/operations.md ("HA") says so.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from broker import keys
from broker.jobs import delivery

# KEYS: meta, message copy, pending set, queue, delivery record, the tag's job.
# ARGV: ttl, message, now, job id, payload, delivery record, then the meta hash's field/value pairs.
WRITE = """
redis.call('HSET', KEYS[1], unpack(ARGV, 7))
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[4])
redis.call('SET', KEYS[5], ARGV[6], 'EX', ARGV[1])
redis.call('SET', KEYS[6], ARGV[4], 'EX', ARGV[1])
redis.call('LPUSH', KEYS[4], ARGV[5])
return 1
"""


def register(client: aioredis.Redis) -> AsyncScript:
    """The write script on `client` (run by its sha; redis-py loads it again after a restart)."""
    return client.register_script(WRITE)


async def write_job(
    client: aioredis.Redis,
    script: AsyncScript,
    job_id: str,
    fields: dict[Any, Any],
    message: str,
    queue_key: str,
    payload: str | bytes,
    record: delivery.Delivery,
    ttl_s: int,
    now: float,
    replicas: int = 0,
    wait_ms: int = 0,
) -> int:
    """Write the job's records (see above); with replicas > 0 WAIT for them on the same
    connection. Returns the replicas that acknowledged (0 without a WAIT)."""
    script_keys = [
        keys.job_meta(job_id),
        keys.job_message(job_id),
        keys.PENDING_JOBS,
        queue_key,
        keys.job_delivery(job_id),
        keys.message_job(record.tag),
    ]
    flat: list[Any] = [x for pair in fields.items() for x in pair]
    args = [ttl_s, message, repr(now), job_id, payload, delivery.encode(record), *flat]
    pipe = client.pipeline(transaction=False)
    await script(keys=script_keys, args=args, client=pipe)
    if replicas > 0:
        pipe.execute_command("WAIT", replicas, wait_ms)
    replies = await pipe.execute()
    return int(replies[-1]) if replicas > 0 else 0
