"""The scaling signal on /metrics, read from Redis at scrape time:

- kvferry_jobs_waiting{class}: every priority band's messages of the shared queue and of each
  worker's own queue (kombu keeps band b of queue q in `q` + SEP + b: broker/priority.py, so a
  single list name would miss all but band 0), the jobs parked by fair dispatch (in no list at
  all; always interactive) and the jobs a worker holds but its engine has not started
  (jobs_running - engine running, per live worker; the heartbeat does not split those by class,
  so they count as interactive);
- kvferry_jobs_running: engine seats in use, kvferry_seats_total: engine seats, over live workers;
- kvferry_seats_usable: what the live workers can run at once now (the policy's pool_room: seats,
  fewer where a KV pool is full at fewer sequences);
- kvferry_queue_wait_p95_seconds: recent jobs' queue wait (this api's window);
- kvferry_engine_wait_seconds: the longest wait now of a sequence not started in an engine;
- kvferry_desired_workers: the policy (api/scale/policy.py) over those figures, with hysteresis."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from api.routing.fleet import WorkerView
from api.scale.policy import FleetLoad, Hysteresis, ScalePolicy, pool_room
from api.scale.wait_window import WaitWindow
from broker import keys, priority
from broker.messages import WorkerStatus

CLASSES: tuple[priority.JobClass, ...] = ("interactive", "batch")
_BATCH_FIRST_BAND = priority.band("batch", -priority.PRIORITY_LIMIT)


@dataclass(frozen=True, slots=True)
class ScaleSnapshot:
    waiting: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0))
    load: FleetLoad = field(default_factory=lambda: FleetLoad(0, 0, 0, 0, None))
    desired: int = 0


async def read_waiting(client: aioredis.Redis, views: list[WorkerView]) -> dict[str, int]:
    """Jobs waiting by class: band lists of every queue + parked + held but not started."""
    queues = [keys.SHARED_QUEUE, *(keys.worker_queue(v.name) for v in views)]
    pipe = client.pipeline(transaction=False)
    for q in queues:
        for b in priority.PRIORITY_STEPS:
            pipe.llen(priority.queue_key(q, b))
    pipe.zcard(keys.PARKED)
    replies: list[Any] = await pipe.execute()
    waiting: dict[str, int] = dict.fromkeys(CLASSES, 0)
    steps = len(priority.PRIORITY_STEPS)
    for i, n in enumerate(replies[:-1]):
        band = priority.PRIORITY_STEPS[i % steps]
        waiting["batch" if band >= _BATCH_FIRST_BAND else "interactive"] += int(n)
    waiting["interactive"] += int(replies[-1]) + sum(_held(v) for v in views)
    return waiting


def _held(view: WorkerView) -> int:
    s = view.status
    if not view.live or s is None:
        return 0
    return max(0, s.jobs_running - (s.engine.num_running if s.engine else 0))


def _room(s: WorkerStatus) -> float:
    seats, e = s.seats or s.concurrency, s.engine  # 0 = unknown: as api/jobs/admission.py
    if e is None:
        return float(seats)  # loading: its seats, soon
    return pool_room(seats, e.num_running, e.pool_blocks_total, e.pool_blocks_used - e.pool_blocks_kept)


def fleet_load(views: list[WorkerView], waiting: dict[str, int], wait_p95_s: float | None) -> FleetLoad:
    live = [v.status for v in views if v.live and v.status is not None]
    engines = [s.engine for s in live if s.engine is not None]
    return FleetLoad(
        workers=len(live),
        seats_total=sum(s.seats or s.concurrency for s in live),
        jobs_running=sum(e.num_running for e in engines),
        jobs_waiting=sum(waiting.values()),
        wait_p95_s=wait_p95_s,
        seats_usable=sum(_room(s) for s in live),
        engine_wait_s=max((e.oldest_waiting_s for e in engines), default=0.0),
    )


class ScaleCollector(Collector):
    def __init__(self, policy: ScalePolicy) -> None:
        self.policy = policy
        self.waits = WaitWindow()
        self.hysteresis = Hysteresis(policy)
        self.snapshot = ScaleSnapshot()

    async def read(self, client: aioredis.Redis, views: list[WorkerView]) -> None:
        now = time.monotonic()
        waiting = await read_waiting(client, views)
        load = fleet_load(views, waiting, self.waits.p95(now))
        self.snapshot = ScaleSnapshot(waiting, load, self.hysteresis.update(load, now))

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot
        waiting = GaugeMetricFamily(
            "kvferry_jobs_waiting",
            "Jobs a new worker would help with: queued in any band, parked, held but not started",
            labels=["class"],
        )
        for job_class, n in s.waiting.items():
            waiting.add_metric([job_class], n)
        yield waiting
        yield GaugeMetricFamily("kvferry_jobs_running", "Engine seats in use", value=s.load.jobs_running)
        yield GaugeMetricFamily(
            "kvferry_seats_total", "Engine seats of the live workers", value=s.load.seats_total
        )
        usable = s.load.seats_total if s.load.seats_usable is None else s.load.seats_usable
        yield GaugeMetricFamily(
            "kvferry_seats_usable",
            "Sequences the live workers can run at once now: seats, fewer where a KV pool is the bound",
            value=usable,
        )
        yield GaugeMetricFamily("kvferry_workers", "Live workers", value=s.load.workers)
        p95 = s.load.wait_p95_s
        yield GaugeMetricFamily(
            "kvferry_queue_wait_p95_seconds",
            "Queue wait p95 of the jobs this api saw start in the last minute (NaN: none)",
            value=float("nan") if p95 is None else p95,
        )
        yield GaugeMetricFamily(
            "kvferry_engine_wait_seconds",
            "The longest wait now of a sequence not started in any worker's engine (seat or pool room)",
            value=s.load.engine_wait_s,
        )
        yield GaugeMetricFamily(
            "kvferry_desired_workers",
            "Workers the scaling policy asks for (api/scale/policy.py)",
            value=s.desired,
        )
