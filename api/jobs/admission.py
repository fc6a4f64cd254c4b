"""Admission terms: what the submit script (api/jobs/submit_write.py) needs to decide, in the same
round trip that records the job, whether it is released to its queue or parked.

Two windows, both summed over the live workers that say their concurrency
(WorkerStatus.concurrency; with none there is no window, 0, and every job is released, as before
fair dispatch existed):
- interactive: max(0, min(concurrency, seats) - dispatch_headroom) each, against the released
  interactive jobs (keys.INFLIGHT): a tenant past its quota parks beyond it, so another tenant's
  request always finds a thread and an engine seat at once;
- batch (api/dispatch/capacity.py, worker_seats): max(1, concurrency - dispatch_headroom) each,
  in jobs, against every running job: with a worker's threads above its seats
  (worker_concurrency > max_num_seqs) batch jobs fill every seat, and an interactive job still
  finds a thread and takes its seat from a batch sequence (the engine preempts batch for
  interactive: workers/engine/scheduler.py).
The fleet is read through the api's FleetCache, so the terms cost no Redis read of their own most
of the time. A tenant's quota is fair_quota x its weight (the keys file's third column), rounded up."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import redis.asyncio as aioredis

from api.jobs.submit_write import Placement
from api.routing.fleet import FleetCache, WorkerView
from broker import priority
from broker.messages import GenerateJob


def window_of(views: Iterable[WorkerView], headroom: int) -> int:
    """Interactive jobs released jobs may number: 0 when no live worker says its concurrency."""
    total = 0
    for view in views:
        status = view.status
        if view.live and status is not None and status.concurrency > 0:
            seats = min(status.concurrency, status.seats or status.concurrency)
            total += max(0, seats - headroom)
    return total


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
