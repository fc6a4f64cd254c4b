"""Admission terms: what the submit script (api/jobs/submit_write.py) needs to decide, in the same
round trip that records the job, whether it is released to its queue or parked.

The window is the fleet's seats less a headroom per worker: the sum over live workers that say
their concurrency (WorkerStatus.concurrency) of max(0, concurrency - dispatch_headroom). With no
such worker there is no window (0): every job is released, as before fair dispatch existed. The
fleet is read through the api's FleetCache, so the terms cost no Redis read of their own most of
the time. A tenant's quota is fair_quota x its weight (the keys file's third column), rounded up."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import redis.asyncio as aioredis

from api.fleet import FleetCache, WorkerView
from api.jobs.submit_write import Placement
from broker import priority
from broker.messages import GenerateJob


def window_of(views: Iterable[WorkerView], headroom: int) -> int:
    """Seats released jobs may fill: 0 when no live worker says its concurrency."""
    seats = 0
    for view in views:
        status = view.status
        if view.live and status is not None and status.concurrency > 0:
            seats += max(0, status.concurrency - headroom)
    return seats


def released(job: GenerateJob, deadline: float) -> Placement:
    """Without fair dispatch: released at once, counted in INFLIGHT all the same."""
    return Placement(job.tenant, job.job_class, deadline)


class Admission:
    def __init__(
        self, headroom: int, fair_quota: int, weight: Callable[[str], float], timeout_s: float
    ) -> None:
        self.headroom = headroom
        self.fair_quota = fair_quota
        self.weight = weight
        self.timeout_s = timeout_s  # a job's INFLIGHT entries lapse this long after its submission

    def quota(self, tenant: str) -> int:
        return math.ceil(self.fair_quota * self.weight(tenant))

    async def placement(
        self, client: aioredis.Redis, fleet: FleetCache, job: GenerateJob, now: float
    ) -> Placement:
        deadline = (job.submitted_at or now) + self.timeout_s
        if job.job_class == "batch":  # never parked: nothing to look up
            return released(job, deadline)
        window = window_of(await fleet.workers(client), self.headroom)
        band = priority.band(job.job_class, job.priority)
        return Placement(job.tenant, job.job_class, deadline, window, self.quota(job.tenant), band)
