"""A fleet of simulated-engine workers in discrete time, driven by the real policy
(api/scale/policy.py's Hysteresis) as the api evaluates it at every scrape: a worker asked for
starts after `start_s` (its process and engine), takes jobs FIFO into its seats, and, once
removed, takes none and leaves when its running jobs end (the drain). A static fleet is the
same with the policy off. worker_seconds: the sum of every worker's life, start to exit."""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

from api.scale.policy import FleetLoad, Hysteresis, ScalePolicy
from ops.bench.autoscale.trace import Job


@dataclass
class Worker:
    born_s: float
    ready_s: float
    seats: int
    ends: list[float] = field(default_factory=list)  # heap: when each running job ends
    draining: bool = False
    gone_s: float | None = None


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
) -> FleetRun:
    workers = [Worker(0.0, 0.0, seats) for _ in range(initial)]
    pending = deque(jobs)
    queue: deque[Job] = deque()
    waits: list[float] = []
    started: deque[tuple[float, float]] = deque()  # (when, wait) of the last minute's starts
    scaler = Hysteresis(policy) if policy else None
    t, next_scrape, peak = 0.0, 0.0, initial
    while pending or queue or any(w.ends for w in workers if w.gone_s is None):
        while pending and pending[0].arrival_s <= t:
            queue.append(pending.popleft())
        for w in workers:
            while w.ends and w.ends[0] <= t:
                heapq.heappop(w.ends)
            if w.draining and not w.ends and w.gone_s is None:
                w.gone_s = t
        for w in sorted((w for w in workers if not w.draining and w.ready_s <= t), key=lambda w: len(w.ends)):
            while queue and len(w.ends) < w.seats:
                job = queue.popleft()
                heapq.heappush(w.ends, t + job.seat_s)
                waits.append(t - job.arrival_s)
                started.append((t, t - job.arrival_s))
        if scaler is not None and t >= next_scrape:
            next_scrape = t + scrape_s
            while started and started[0][0] < t - 60:
                started.popleft()
            _scale(workers, scaler, queue, started, t, start_s, seats)
            peak = max(peak, sum(1 for w in workers if not w.draining))
        t += dt
    life = sum((w.gone_s if w.gone_s is not None else t) - w.born_s for w in workers)
    return FleetRun(p95(waits), life, peak, tuple(waits))


def _scale(
    workers: list[Worker],
    scaler: Hysteresis,
    queue: deque[Job],
    started: deque[tuple[float, float]],
    t: float,
    start_s: float,
    seats: int,
) -> None:
    live = [w for w in workers if not w.draining]
    ready = [w for w in live if w.ready_s <= t]
    load = FleetLoad(
        workers=len(live),
        seats_total=len(live) * seats,
        jobs_running=sum(len(w.ends) for w in ready),
        jobs_waiting=len(queue),
        wait_p95_s=p95([s for _, s in started]) if started else None,
    )
    desired = scaler.update(load, t)
    for _ in range(desired - len(live)):  # KEDA/HPA: to the figure at once
        workers.append(Worker(t, t + start_s, seats))
    for w in sorted(live, key=lambda w: (w.ready_s <= t, len(w.ends)))[: max(0, len(live) - desired)]:
        w.draining = True  # the drain: no new job, leaves when its running ones end
        if not w.ends:
            w.gone_s = t
