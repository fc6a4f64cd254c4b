"""Maintenance against a real Redis: one elected sweeper per pass (the other takes over once the
holder stops renewing), and a malformed unacked entry that fails alone, leaving every later step
and entry of the pass to run."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import redis

from broker import keys
from broker.celery_app import BrokerConfig, make_celery
from broker.jobs import delivery
from ops.redis.server import RedisServer
from workers.engine.config import EngineConfig
from workers.jobs.engine_service import EngineService, WorkerIdentity
from workers.jobs.maintenance import Maintenance
from workers.jobs.sweeper_lease import holder

VOID = "kvferry.test.void"  # a queue nobody consumes


def _maintenance(url: str, name: str, tmp: Path, lease_ttl_s: float = 1.0) -> Maintenance:
    service = EngineService(EngineConfig(model="tiny"), tmp, url, WorkerIdentity(name))
    app = make_celery(BrokerConfig(redis_url=url))
    return Maintenance(service, 0.05, orphan_grace_s=5, app=app, lease_ttl_s=lease_ttl_s)


def unacked_job(rds: redis.Redis, job_id: str, queue: str, age_s: float, record: bool = True) -> str:
    """A delivered-but-unacked kvferry.generate message, as kombu keeps it, with the api's record."""
    tag = uuid.uuid4().hex
    payload = {"headers": {"id": job_id, "task": keys.GENERATE_TASK}, "properties": {"delivery_tag": tag}}
    rds.hset(keys.KOMBU_UNACKED, tag, json.dumps([payload, queue, queue]))
    rds.zadd(keys.KOMBU_UNACKED_INDEX, {tag: time.time() - age_s})
    if record:
        pipe = rds.pipeline()
        delivery.record(pipe, job_id, delivery.Delivery(tag, queue, time.time() - age_s), 600)
        pipe.execute()
    return tag


def test_one_sweeper_per_pass_and_a_takeover_when_it_stops(
    rds: redis.Redis, sweep_redis: RedisServer, tmp_path: Path
) -> None:
    a = _maintenance(sweep_redis.url, "a@h", tmp_path)
    b = _maintenance(sweep_redis.url, "b@h", tmp_path)
    for _ in range(4):
        assert [a.run_once(), b.run_once()].count(True) == 1  # one sweeps, every pass
    first, other = (a, b) if a.figures.sweeps else (b, a)
    assert first.figures.sweeps == 4 and other.figures.sweeps == 0
    assert holder(rds) == first.service.identity.name
    assert other.figures.passes == 4 and not other.figures.sweeper
    # the holder dies (stops renewing): the other takes over once the lease lapses, not before
    assert not other.run_once()
    time.sleep(1.2)
    assert any(other.run_once() for _ in range(2))  # a stand-by tries every other pass
    assert holder(rds) == other.service.identity.name
    assert not any(first.run_once() for _ in range(2))  # it came back: the lease is taken
    other.stop()  # a clean stop hands the lease on at once
    assert any(first.run_once() for _ in range(2))


def test_a_malformed_unacked_entry_fails_alone(
    rds: redis.Redis, sweep_redis: RedisServer, tmp_path: Path
) -> None:
    """Fails before the fix: the malformed entry's json.loads raised out of the orphan sweep, and
    every later step of every pass (the good orphan, the session sweep) never ran."""
    m = _maintenance(sweep_redis.url, "a@h", tmp_path)
    for bad in (b"not json", json.dumps({"no": "list"}), json.dumps([{"headers": 3}, "q", "q"])):
        tag = uuid.uuid4().hex
        rds.hset(keys.KOMBU_UNACKED, tag, bad)
        rds.zadd(keys.KOMBU_UNACKED_INDEX, {tag: time.time() - 120})  # the oldest: swept first
    good = unacked_job(rds, "job-good", VOID, age_s=60, record=False)
    member = keys.session_member("", "expired-session")
    rds.zadd(keys.SESSION_EXPIRY, {member: time.time() - 10})
    m.run_once()
    m.run_once()
    queued = [json.loads(raw)["headers"]["id"] for raw in rds.lrange(VOID, 0, -1)]
    assert queued == ["job-good"]  # the orphan after the malformed entries went back
    assert not rds.hexists(keys.KOMBU_UNACKED, good)
    assert rds.zscore(keys.SESSION_EXPIRY, member) is None  # the session sweep ran
    assert m.counts["malformed_entries"] == 3  # counted once each: classified, then skipped
    assert m.figures.failures == 3 and m.figures.sweeps == 2


def test_a_failing_step_does_not_stop_the_next(
    rds: redis.Redis, sweep_redis: RedisServer, tmp_path: Path
) -> None:
    m = _maintenance(sweep_redis.url, "a@h", tmp_path)
    ran = []

    def boom() -> None:
        raise RuntimeError("a bug in one step")

    m.steps = lambda: [("reap", boom), ("orphans", lambda: ran.append("orphans"))]  # type: ignore[method-assign]
    assert m.run_once()
    assert ran == ["orphans"] and m.counts["reap_failed"] == 1
