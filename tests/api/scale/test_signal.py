"""The scaling signal on /metrics against a real redis-server and api: every band's messages,
the parked jobs and the jobs a worker holds unstarted count in kvferry_jobs_waiting, by class."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from api.app import create_app
from api.config import ApiConfig
from api.routing.fleet import workers
from api.scale.signal import read_waiting
from broker import keys, priority
from broker.messages import EngineFigures, WorkerStatus
from broker.worker_registry import HEARTBEAT_FIELD, encode_status
from tests.api.conftest import Deployment, Served
from tests.api.fake_worker import FakeWorker
from tests.api.test_dispatch import beat

MODEL = "smollm2"


@pytest.fixture
def seats_only_api(
    redis_url: str, rds: redis.Redis, deployment: Deployment, tmp_path: Path
) -> Iterator[Served]:
    """fresh_api with the policy on seats alone (no spare seats, no growth lead): its figure by hand."""
    config = ApiConfig(
        redis_url=redis_url,
        served_models=(MODEL,),
        files_dir=tmp_path / "files",
        scale_spare_seats=0,
        scale_growth_lead_s=0.0,
    )
    yield deployment.start(object(), create_app(config))
    deployment.stop()


def test_parked_jobs_count_in_jobs_waiting(
    seats_only_api: Served, rds: redis.Redis, worker: FakeWorker
) -> None:
    beat(rds, "w1@test", 6)  # window 6 - 4 (the default headroom) = 2: the rest parks
    time.sleep(1.1)  # past the api's fleet cache
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 3}
    worker.pause()
    with seats_only_api.client() as c:
        for _ in range(6):  # 4 released (the default quota) into band 2, 2 parked
            assert c.post("/v1/jobs", json={"endpoint": "/v1/completions", "body": body}).status_code == 202
        text = c.get("/metrics").text
    worker.resume()
    assert rds.zcard(keys.PARKED) == 2
    assert 'kvferry_jobs_waiting{class="interactive"} 6.0' in text, text
    assert 'kvferry_jobs_waiting{class="batch"} 0.0' in text
    assert "kvferry_seats_total 6.0" in text  # beat() says concurrency 6 and no seats: its concurrency
    assert "kvferry_desired_workers 2.0" in text  # 6 waiting / (6 seats x 0.8) -> 2


def test_every_band_of_every_queue_and_the_held_jobs(rds: redis.Redis, redis_url: str) -> None:
    own = keys.worker_queue("w1@test")
    for band in (0, 4, 5, 9):  # kombu's suffixed lists, interactive and batch
        rds.lpush(priority.queue_key(keys.SHARED_QUEUE, band), b"m")
    rds.lpush(priority.queue_key(own, 7), b"m", b"m")
    engine = EngineFigures(2, 1, 0, 8, 0, 10, 4, 0, 1, 0, 0, 0.0, 0, 0)
    status = WorkerStatus("w1@test", own, MODEL, 5, 0, 0, time.time(), engine, concurrency=8, seats=8)
    rds.hset(keys.worker_heartbeat("w1@test"), HEARTBEAT_FIELD, encode_status(status))
    rds.expire(keys.worker_heartbeat("w1@test"), 60)
    rds.sadd(keys.WORKERS, "w1@test")
    rds.zadd(keys.PARKED, {"j1": 1.0})

    async def go() -> dict[str, int]:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(redis_url)
        try:
            return await read_waiting(client, await workers(client))
        finally:
            await client.aclose()

    # interactive: bands 0 and 4, one parked, 5 running jobs less 2 in the engine's batch = 3 held
    assert asyncio.run(go()) == {"interactive": 2 + 1 + 3, "batch": 2 + 2}


def test_a_full_pool_on_metrics(seats_only_api: Served, rds: redis.Redis) -> None:
    """A worker of 8 seats whose pool is full at the 4 sequences it runs, 2 more waiting in its
    engine for 3 s: room 4, the wait it reads 3 s, and 2 workers (by its 8 seats: 6 / 6.4 -> 1)."""
    own = keys.worker_queue("w1@test")
    engine = EngineFigures(4, 2, 0, 8, 0, 100, 100, 0, 1, 0, 0, 0.0, 0, 0, oldest_waiting_s=3.0)
    status = WorkerStatus("w1@test", own, MODEL, 6, 0, 0, time.time(), engine, concurrency=12, seats=8)
    rds.hset(keys.worker_heartbeat("w1@test"), HEARTBEAT_FIELD, encode_status(status))
    rds.expire(keys.worker_heartbeat("w1@test"), 60)
    rds.sadd(keys.WORKERS, "w1@test")
    time.sleep(1.1)  # past the api's fleet cache
    with seats_only_api.client() as c:
        text = c.get("/metrics").text
    assert "kvferry_seats_total 8.0" in text and "kvferry_seats_usable 4.0" in text, text
    assert "kvferry_engine_wait_seconds 3.0" in text
    assert "kvferry_desired_workers 2.0" in text  # 6 / (4 x 0.8) -> 2; late: 1 + 1
