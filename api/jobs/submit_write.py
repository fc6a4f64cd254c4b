"""A job's submission in Redis: one script writes the job's metadata, its message copy and pending
entry (the record workers/jobs/lost_messages.py resends from), the sweeps' delivery records
(broker/jobs/delivery.py) and its queue message, all or nothing; under Sentinel a WAIT follows on
the same connection, so the api answers only once a replica holds the job.

The same script decides the job's admission (api/dispatch/, docs/architecture.md "Fair share"):
while the released, unfinished jobs (keys.INFLIGHT) and the parked ones fill the window, an
interactive job whose tenant already has its quota released is PARKED instead: its metadata,
message copy and what its release writes (keys.job_parked), no pending entry and no message, so
no sweep resends it; the dispatcher's release script (api/dispatch/release.py) queues it later.
Any other job is released: queued as above; an interactive one is added to INFLIGHT and to its
tenant's share. A batch line is never parked nor counted there (the batch runner counts its own
running lines against the batch window: api/dispatch/capacity.py). No round trip is added for the
decision.

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

from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from broker import keys
from broker.jobs import delivery
from broker.priority import JobClass

# KEYS: meta, message copy, pending set, queue, delivery record, the tag's job, INFLIGHT, the
# tenant's released jobs, PARKED, the tenant's parked jobs, PARKED_TENANTS, the job's parked hash.
# ARGV: ttl, message, now, job id, payload, delivery record, window (0: none known), quota, class,
# deadline, rank among the tenant's parked jobs, tenant, delivery tag, delivery queue, then the
# meta hash's field/value pairs. Returns 1 released, 0 parked.
WRITE = """
redis.call('HSET', KEYS[1], unpack(ARGV, 15))
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', ARGV[3])
local interactive = ARGV[9] ~= 'batch'
if interactive then
  redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', ARGV[3])
  local window = tonumber(ARGV[7])
  if window > 0 and redis.call('ZCARD', KEYS[7]) + redis.call('ZCARD', KEYS[9]) >= window
     and redis.call('ZCARD', KEYS[8]) >= tonumber(ARGV[8]) then
    redis.call('HSET', KEYS[12], 'key', KEYS[4], 'payload', ARGV[5], 'tag', ARGV[13], 'queue', ARGV[14],
      'tenant', ARGV[12], 'deadline', ARGV[10], 'ttl', ARGV[1])
    redis.call('EXPIRE', KEYS[12], ARGV[1])
    redis.call('ZADD', KEYS[10], ARGV[11], ARGV[4])
    redis.call('ZADD', KEYS[9], ARGV[3], ARGV[4])
    redis.call('SADD', KEYS[11], ARGV[12])
    return 0
  end
  redis.call('ZADD', KEYS[8], ARGV[10], ARGV[4])
  redis.call('ZADD', KEYS[7], ARGV[10], ARGV[4])
end
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[4])
redis.call('SET', KEYS[5], ARGV[6], 'EX', ARGV[1])
redis.call('SET', KEYS[6], ARGV[4], 'EX', ARGV[1])
redis.call('LPUSH', KEYS[4], ARGV[5])
return 1
"""
PARK_BAND_SCALE = 1e10  # rank = band x this + park time: a lower band first, then first parked


@dataclass(frozen=True, slots=True)
class Placement:
    """What the admission decision needs besides the job's records (api/jobs/admission.py)."""

    tenant: str = ""
    job_class: JobClass = "interactive"  # or "batch": never parked, no tenant share
    deadline: float = 0.0  # when its INFLIGHT entries lapse if no end is seen
    window: int = 0  # 0: no window known, every job is released
    quota: int = 0  # released interactive jobs the tenant may always have
    band: int = 0  # its priority band: among a tenant's parked jobs, the lowest band goes first


@dataclass(frozen=True, slots=True)
class Written:
    parked: bool
    acked: int  # replicas that acknowledged (0 without a WAIT)


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
    placement: Placement | None = None,
) -> Written:
    """Write the job's records (see above); with replicas > 0 WAIT for them on the same
    connection."""
    place = placement or Placement(deadline=now + ttl_s)
    script_keys = [
        keys.job_meta(job_id),
        keys.job_message(job_id),
        keys.PENDING_JOBS,
        queue_key,
        keys.job_delivery(job_id),
        keys.message_job(record.tag),
        keys.INFLIGHT,
        keys.tenant_inflight(place.tenant),
        keys.PARKED,
        keys.tenant_parked(place.tenant),
        keys.PARKED_TENANTS,
        keys.job_parked(job_id),
    ]
    flat: list[Any] = [x for pair in fields.items() for x in pair]
    rank = place.band * PARK_BAND_SCALE + now
    args = [
        ttl_s,
        message,
        repr(now),
        job_id,
        payload,
        delivery.encode(record),
        place.window,
        place.quota,
        place.job_class,
        repr(place.deadline),
        repr(rank),
        place.tenant,
        record.tag,
        record.queue,
        *flat,
    ]
    try:
        replies = await _run(client, script, script_keys, args, replicas, wait_ms)
    except NoScriptError:
        # The pipeline checks its script once, but its retry may land on a new primary (a
        # Sentinel failover) that never loaded it. The script did not run, so nothing of the
        # job was written; a new pipeline loads it where it runs now.
        replies = await _run(client, script, script_keys, args, replicas, wait_ms)
    return Written(parked=int(replies[0]) == 0, acked=int(replies[-1]) if replicas > 0 else 0)


async def _run(
    client: aioredis.Redis,
    script: AsyncScript,
    script_keys: list[str],
    args: list[Any],
    replicas: int,
    wait_ms: int,
) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    await script(keys=script_keys, args=args, client=pipe)
    if replicas > 0:
        pipe.execute_command("WAIT", replicas, wait_ms)
    return list(await pipe.execute())
