"""What the api keeps in memory stays bounded, and its background loops outlive a bug: RecentRoutes
forgets a worker routed to no more, the batch collector the looks of ended batches, and the
dispatcher loop goes on (logged, counted on /metrics) after an exception that is not Redis's."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import redis

from api.batches.run.collector import Collector
from api.dispatch.dispatcher import Dispatcher
from api.jobs.admission import Admission
from api.jobs.client import JobClient
from api.routing.recent import RecentRoutes
from broker import keys
from broker.celery_app import BrokerConfig


def test_recent_routes_forget_a_worker_routed_to_no_more() -> None:
    recent = RecentRoutes(horizon_s=0.05)
    for i in range(50):
        recent.add("gone", 10.0, job_id=f"g{i}")
    recent.ended("g0")
    time.sleep(0.1)
    recent.add("busy", 1.0, job_id="b0")
    assert set(recent._routes) == {"busy"} and set(recent._by_job) == {"b0"}
    assert not recent._ends.get("gone") and not recent._prefills.get("gone")


def test_recent_routes_keep_at_most_max_routes_per_worker() -> None:
    recent = RecentRoutes(horizon_s=60, max_routes=10)
    for i in range(100):
        recent.add("w", 1.0, job_id=f"j{i}")
    assert len(recent._routes["w"]) == 10 and len(recent._by_job) == 10
    assert recent.since("w", 0.0).jobs == 10


def test_the_collector_forgets_the_looks_of_ended_batches() -> None:
    collector = Collector(cast(Any, None), cast(Any, None))
    collector._next_look = {"batch_a:1": 1.0, "batch_a:7": 2.0, "batch_b:3": 3.0}
    collector.keep({"batch_b"})
    assert collector._next_look == {"batch_b:3": 3.0}


def test_the_dispatcher_outlives_a_bug_and_shows_it(private: tuple[redis.Redis, str]) -> None:
    """A pass raising something other than a Redis error (here the tenants' weights) is logged and
    counted, the loop goes on, and releases once the cause is gone."""
    rds, url = private
    rds.zadd(keys.PARKED, {"nothing": time.time()})  # something parked: the pass runs in full
    broken = [True]

    def weights() -> dict[str, float]:
        if broken[0]:
            raise ValueError("a weights file half written")
        return {}

    async def go() -> None:
        admission = Admission(2, 1, lambda _t: 1.0, 600.0)
        client = JobClient(BrokerConfig(redis_url=url), job_ttl_s=600, admission=admission)
        dispatcher = Dispatcher(client, 2, weights, name="api-test")
        dispatcher.start()
        try:
            await asyncio.sleep(2.5)  # a failing pass, then another a follower's period later
            assert dispatcher.task is not None and not dispatcher.task.done(), "the loop died"
            assert dispatcher.failures.failures >= 2 and dispatcher.failures.failing
            deadline = time.monotonic() + 10
            broken[0] = False
            while dispatcher.failures.failing:
                assert time.monotonic() < deadline, "the loop never passed again"
                await asyncio.sleep(0.05)
        finally:
            await dispatcher.stop()
            await client.close()

    asyncio.run(go())
