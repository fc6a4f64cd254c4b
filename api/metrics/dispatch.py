"""Fair dispatch on /metrics, read from Redis at scrape time: parked jobs by tenant
(`kvferry_jobs_parked`), the window (`kvferry_dispatch_window`) and the released unfinished jobs
(`kvferry_jobs_inflight`), and the queue-wait histogram ApiMetrics observes where finals are seen."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from api.jobs.admission import window_of
from api.routing.fleet import WorkerView
from broker import keys

QUEUE_WAIT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 7200, 86400)


def queue_wait_histogram(registry: CollectorRegistry) -> Histogram:
    return Histogram(
        "kvferry_queue_wait_seconds",
        "From submission to a worker starting the job (parked time included), by tenant and class",
        ["tenant", "class"],
        buckets=QUEUE_WAIT_BUCKETS,
        registry=registry,
    )


@dataclass
class DispatchSnapshot:
    parked: dict[str, int] = field(default_factory=dict)
    window: int = 0
    inflight: int = 0


async def read(client: aioredis.Redis, views: list[WorkerView], headroom: int) -> DispatchSnapshot:
    raw: Any = await client.smembers(keys.PARKED_TENANTS)
    tenants = sorted(t.decode() for t in raw)
    pipe = client.pipeline(transaction=False)
    for tenant in tenants:
        pipe.zcard(keys.tenant_parked(tenant))
    pipe.zcount(keys.INFLIGHT, f"({time.time()!r}", "+inf")
    replies: list[Any] = await pipe.execute()
    parked = {t: int(n) for t, n in zip(tenants, replies, strict=False) if int(n)}
    return DispatchSnapshot(parked, window_of(views, headroom), int(replies[-1]))


class DispatchCollector(Collector):
    def __init__(self) -> None:
        self.snapshot = DispatchSnapshot()

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot
        parked = GaugeMetricFamily(
            "kvferry_jobs_parked", "Interactive jobs parked for fair dispatch, by tenant", labels=["tenant"]
        )
        for tenant, n in s.parked.items():
            parked.add_metric([tenant], n)
        yield parked
        yield GaugeMetricFamily(
            "kvferry_dispatch_window", "Seats released jobs may fill (0: no window known)", value=s.window
        )
        yield GaugeMetricFamily("kvferry_jobs_inflight", "Released jobs not yet finished", value=s.inflight)
