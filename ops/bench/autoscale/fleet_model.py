"""A fleet of simulated-engine workers in discrete time, driven by the real policy
(api/scale/policy.py's Hysteresis) as the api evaluates it at every scrape: a worker asked for
starts after `start_s` (its process and engine), takes jobs FIFO into its seats (each to the
least loaded worker with a free seat), and, once removed, takes none and leaves when its running
jobs end (the drain). A static fleet is the same with the policy off. worker_seconds: the sum of
every worker's life, start to exit.

With `pool_blocks` (and jobs that carry blocks, trace.py), each worker's KV pool holds that many
blocks: a job it has taken (its task started: the queue wait the api sees) runs once its blocks
fit, first come first served, and waits in the engine till then; its heartbeat says what it runs,
the blocks they hold and its oldest such wait, read by the policy as the api reads them
(api/scale/signal.py). `pool_blind` hides those from the policy (seats and queue wait only: the
policy before issue 43), to weigh what they change. waits: each job's wait to run, both waits."""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

from api.scale.policy import FleetLoad, Hysteresis, ScalePolicy, pool_room
from ops.bench.autoscale.trace import Job


@dataclass
class Worker:
    born_s: float
    ready_s: float
    seats: int
    pool: int = 0  # KV blocks; 0: no pool bound
    ends: list[tuple[float, int]] = field(default_factory=list)  # heap: (end, blocks) of each running job
    held: deque[tuple[float, Job]] = field(default_factory=deque)  # (taken at, job): waiting for room
    used: int = 0  # blocks its running jobs hold
    draining: bool = False
    gone_s: float | None = None

    @property
    def jobs(self) -> int:
        return len(self.ends) + len(self.held)

    def run_held(self, t: float, waits: list[float]) -> None:
        """Start the jobs it holds, in order, while their blocks fit (one alone always runs)."""
        while self.held and (
            not self.pool or not self.ends or self.used + self.held[0][1].blocks <= self.pool
        ):
            job = self.held.popleft()[1]
            heapq.heappush(self.ends, (t + job.seat_s, job.blocks))
            self.used += job.blocks
            waits.append(t - job.arrival_s)


@dataclass(frozen=True, slots=True)
class FleetRun:
    queue_wait_p95_s: float
    worker_seconds: float
    max_workers: int
    waits: tuple[float, ...]


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)] if ordered else 0.0


def run_fleet(
    jobs: list[Job],
    seats: int,
    initial: int,
    policy: ScalePolicy | None,
    start_s: float = 5.0,
    dt: float = 0.25,
    scrape_s: float = 5.0,
    pool_blocks: int = 0,
    pool_blind: bool = False,
) -> FleetRun:
    workers = [Worker(0.0, 0.0, seats, pool_blocks) for _ in range(initial)]
    pending = deque(jobs)
    queue: deque[Job] = deque()
    waits: list[float] = []
    started: deque[tuple[float, float]] = deque()  # (when, queue wait) of the last minute's task starts
    scaler = Hysteresis(policy) if policy else None
    t, next_scrape, peak = 0.0, 0.0, initial
    while pending or queue or any(w.jobs for w in workers if w.gone_s is None):
        while pending and pending[0].arrival_s <= t:
            queue.append(pending.popleft())
        for w in workers:
            while w.ends and w.ends[0][0] <= t:
                w.used -= heapq.heappop(w.ends)[1]
            w.run_held(t, waits)
            if w.draining and not w.jobs and w.gone_s is None:
                w.gone_s = t
        ready = [w for w in workers if not w.draining and w.ready_s <= t]
        while queue and (open_ := [w for w in ready if w.jobs < w.seats]):
            w = min(open_, key=lambda w: (w.jobs, w.used))  # each job to the least loaded worker
            job = queue.popleft()
            w.held.append((t, job))
            started.append((t, t - job.arrival_s))
            w.run_held(t, waits)
        if scaler is not None and t >= next_scrape:
            next_scrape = t + scrape_s
            while started and started[0][0] < t - 60:
                started.popleft()
            load = _load(workers, queue, started, t, pool_blind)
            _scale(workers, scaler.update(load, t), t, start_s, seats, pool_blocks)
            peak = max(peak, sum(1 for w in workers if not w.draining))
        t += dt
    life = sum((w.gone_s if w.gone_s is not None else t) - w.born_s for w in workers)
    return FleetRun(p95(waits), life, peak, tuple(waits))


def _load(
    workers: list[Worker], queue: deque[Job], started: deque[tuple[float, float]], t: float, blind: bool
) -> FleetLoad:
    """What the api reads at a scrape: the live workers' heartbeats, the queue, the window."""
    live = [w for w in workers if not w.draining]
    ready = [w for w in live if w.ready_s <= t]
    return FleetLoad(
        workers=len(live),
        seats_total=sum(w.seats for w in live),
        jobs_running=sum(len(w.ends) for w in ready),
        jobs_waiting=len(queue) + sum(len(w.held) for w in ready),
        wait_p95_s=p95([s for _, s in started]) if started else None,
        seats_usable=None if blind else sum(pool_room(w.seats, len(w.ends), w.pool, w.used) for w in live),
        engine_wait_s=0.0 if blind else max((t - w.held[0][0] for w in ready if w.held), default=0.0),
    )


def _scale(workers: list[Worker], desired: int, t: float, start_s: float, seats: int, pool: int) -> None:
    live = [w for w in workers if not w.draining]
    for _ in range(desired - len(live)):  # KEDA/HPA: to the figure at once
        workers.append(Worker(t, t + start_s, seats, pool))
    for w in sorted(live, key=lambda w: (w.ready_s <= t, w.jobs))[: max(0, len(live) - desired)]:
        w.draining = True  # the drain: no new job, leaves when its jobs end
        if not w.jobs:
            w.gone_s = t
