"""A job's submission in Redis: one script writes the job's metadata, its message copy and pending
entry (the record workers/jobs/lost_messages.py resends from), the sweeps' delivery records
(broker/jobs/delivery.py) and its queue message, all or nothing; under Sentinel a WAIT follows on
the same connection, so the api answers only once a replica holds the job.

The same script decides the job's admission (api/dispatch/, docs/routing.md "Fair share"):
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
(the primary's AOF). docs/ha.md says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError

from api.lua import Script
from broker import keys
from broker.jobs import delivery
from broker.priority import JobClass

SUBMIT = Script(__file__, "submit")
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


@dataclass(frozen=True, slots=True)
class JobWrite:
    """KEYS and ARGV of lua/submit.lua: one job's records and its queue message."""

    job_id: str
    fields: dict[Any, Any]  # the metadata hash's
    message: str  # the message copy (keys.job_message)
    queue_key: str
    payload: str | bytes  # the queue message
    record: delivery.Delivery
    ttl_s: int
    now: float
    placement: Placement | None = None  # None: released, no tenant

    @property
    def place(self) -> Placement:
        return self.placement or Placement(deadline=self.now + self.ttl_s)

    def keys(self) -> list[str]:
        job_id, tenant = self.job_id, self.place.tenant
        return [
            keys.job_meta(job_id),
            keys.job_message(job_id),
            keys.PENDING_JOBS,
            self.queue_key,
            keys.job_delivery(job_id),
            keys.message_job(self.record.tag),
            keys.INFLIGHT,
            keys.tenant_inflight(tenant),
            keys.PARKED,
            keys.tenant_parked(tenant),
            keys.PARKED_TENANTS,
            keys.job_parked(job_id),
        ]

    def args(self) -> list[Any]:
        place = self.place
        flat: list[Any] = [x for pair in self.fields.items() for x in pair]
        rank = place.band * PARK_BAND_SCALE + self.now
        return [
            self.ttl_s,
            self.message,
            repr(self.now),
            self.job_id,
            self.payload,
            delivery.encode(self.record),
            place.window,
            place.quota,
            place.job_class,
            repr(place.deadline),
            repr(rank),
            place.tenant,
            self.record.tag,
            self.record.queue,
            *flat,
        ]


async def write_job(client: aioredis.Redis, job: JobWrite, replicas: int = 0, wait_ms: int = 0) -> Written:
    """Write the job's records (see above); with replicas > 0 WAIT for them on the same
    connection."""
    try:
        replies = await _run(client, job, replicas, wait_ms)
    except NoScriptError:
        # The pipeline checks its script once, but its retry may land on a new primary (a
        # Sentinel failover) that never loaded it. The script did not run, so nothing of the
        # job was written; a new pipeline loads it where it runs now.
        replies = await _run(client, job, replicas, wait_ms)
    return Written(parked=int(replies[0]) == 0, acked=int(replies[-1]) if replicas > 0 else 0)


async def _run(client: aioredis.Redis, job: JobWrite, replicas: int, wait_ms: int) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    await SUBMIT.run(pipe, job)
    if replicas > 0:
        pipe.execute_command("WAIT", replicas, wait_ms)
    return list(await pipe.execute())
