"""The sweeps read their own small records, never the jobs' payloads: a recorded message is never
json-decoded by the orphan sweep, an unrecorded one once; the lost-message check reads no queue and
no unacked payload, and tells a queued job from a lost one by its queue's progress."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
import redis

from broker import keys, priority
from broker.celery_app import BrokerConfig, make_celery
from broker.codec import encode_job
from broker.jobs import delivery
from broker.jobs.lease import JobLeases, make_owner
from broker.messages import GenerateJob
from ops.redis.server import RedisServer
from tests.integration.jobs import start_lease
from tests.workers.jobs.test_maintenance import VOID, unacked_job
from workers.jobs import lost_messages, reaper, unacked


def _command_calls(rds: redis.Redis) -> dict[str, int]:
    stats: Any = rds.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def test_the_orphan_sweep_parses_no_recorded_payload(
    rds: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded: list[int] = []
    real_loads = json.loads

    def counting_loads(raw: Any, *args: Any, **kwargs: Any) -> Any:
        decoded.append(len(raw))
        return real_loads(raw, *args, **kwargs)

    monkeypatch.setattr(unacked.json, "loads", counting_loads)
    huge = "x" * 2_000_000  # a long prompt: the sweep must not read it pass after pass
    leased = unacked_job(rds, "job-leased", VOID, age_s=60)
    raw = rds.hget(keys.KOMBU_UNACKED, leased)
    payload, ex, rk = real_loads(raw)  # type: ignore[arg-type]
    payload["body"] = huge
    rds.hset(keys.KOMBU_UNACKED, leased, json.dumps([payload, ex, rk]))
    start_lease(JobLeases(rds, ttl_s=30), "job-leased", make_owner("w@h", "p"))
    unacked_job(rds, "job-unrecorded", VOID, age_s=60, record=False)
    start_lease(JobLeases(rds, ttl_s=30), "job-unrecorded", make_owner("w@h", "p"))
    for _ in range(3):
        assert reaper.sweep_orphans(rds, grace_s=30) == ([], 0)
    assert len(decoded) == 1 and decoded[0] < 1000  # the unrecorded one, once; never the huge one
    assert rds.get(keys.message_job(leased)) == b"job-leased"


def test_lost_messages_are_found_in_o1_per_job(rds: redis.Redis, sweep_redis: RedisServer) -> None:
    """lost: its queue is empty and it is nowhere; popped: a later job of its queue started, and it
    is nowhere; delivered: among the unacked; queued: still behind on its queue; started: leased."""
    app = make_celery(BrokerConfig(redis_url=sweep_redis.url))
    job = encode_job(GenerateJob("m", prompt_token_ids=(1, 2, 3)))
    old = time.time() - 60
    busy, empty = f"{VOID}.busy", f"{VOID}.empty"
    names = {
        n: f"job-{n}-{uuid.uuid4().hex[:6]}" for n in ("lost", "popped", "delivered", "queued", "started")
    }
    queue_of = {"lost": empty, "popped": busy, "delivered": busy, "queued": busy, "started": busy}
    for n, job_id in names.items():
        rds.set(keys.job_message(job_id), json.dumps({"job": job, "queue": queue_of[n]}))
        rds.zadd(keys.PENDING_JOBS, {job_id: old})
        pipe = rds.pipeline()
        at = old + (10 if n == "queued" else 0)  # submitted after `busy`'s workers got
        delivery.record(pipe, job_id, delivery.Delivery(f"tag-{job_id}", queue_of[n], at), 600)
        pipe.execute()
    rds.lpush(busy, *[f"another message {i}" for i in range(500)])  # a backlog: never read
    delivery.note_started(rds, busy, old + 5)  # busy's workers started a job submitted at old + 5
    rds.hset(keys.KOMBU_UNACKED, f"tag-{names['delivered']}", "[]")
    rds.set(keys.job_epoch(names["started"]), 1)
    before = _command_calls(rds)
    sent = lost_messages.resend_lost(rds, app, grace_s=30)
    calls = {c: n - before.get(c, 0) for c, n in _command_calls(rds).items() if n != before.get(c, 0)}
    assert set(sent) == {names["lost"], names["popped"]}
    assert not {"lrange", "hvals", "hgetall", "hscan", "lpos"} & calls.keys(), calls
    for n in ("lost", "popped"):  # sent again under the same id, with a record of the new copy
        record = delivery.parse(rds.get(keys.job_delivery(names[n])))
        assert record is not None and rds.get(keys.message_job(record.tag)) == names[n].encode()
    assert not rds.exists(keys.job_message(names["started"]))  # started: nothing to watch
    score = rds.zscore(keys.PENDING_JOBS, names["queued"])
    assert score is not None and score > old  # looked at again a grace later
    again = priority.queue_key(empty, priority.band("interactive", 0))  # into the job's band
    heads = [json.loads(m)["headers"]["id"] for m in rds.lrange(again, 0, -1)]
    assert heads == [names["lost"]]
