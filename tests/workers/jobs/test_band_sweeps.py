"""The sweeps keep a job in its priority band (broker/priority.py): a lost message is sent again
into its band's list, an unacked one is restored into it, a dead worker's queued jobs move band by
band; and a job still queued behind in a slow band is not taken for lost because a faster band of
the same queue moved on (each band list is first in, first out, the queue as a whole is not)."""

from __future__ import annotations

import json
import time
import uuid

import redis

from broker import keys, priority
from broker.celery_app import BrokerConfig, make_celery
from broker.codec import encode_job
from broker.jobs import delivery
from broker.messages import GenerateJob
from ops.redis.server import RedisServer
from tests.workers.jobs.test_maintenance import VOID
from workers.jobs import lost_messages, reaper, unacked

BATCH = encode_job(GenerateJob("m", prompt_token_ids=(1, 2), job_class="batch", priority=1))  # band 8


def _pending(rds: redis.Redis, job_id: str, queue_key: str, at: float) -> None:
    rds.set(keys.job_message(job_id), json.dumps({"job": BATCH, "queue": VOID}))
    rds.zadd(keys.PENDING_JOBS, {job_id: at})
    pipe = rds.pipeline()
    delivery.record(pipe, job_id, delivery.Delivery(f"tag-{job_id}", queue_key, at), 600)
    pipe.execute()


def test_a_lost_batch_line_is_sent_again_into_its_band(rds: redis.Redis, redis_server: RedisServer) -> None:
    app = make_celery(BrokerConfig(redis_url=redis_server.url))
    old = time.time() - 60
    band8, band2 = priority.queue_key(VOID, 8), priority.queue_key(VOID, 2)
    lost, behind = f"lost-{uuid.uuid4().hex[:6]}", f"behind-{uuid.uuid4().hex[:6]}"
    _pending(rds, lost, band8, old)  # its band's list is empty: it is nowhere
    _pending(rds, behind, priority.queue_key(keys.SHARED_QUEUE, 8), old)
    rds.lpush(priority.queue_key(keys.SHARED_QUEUE, 8), "a batch line ahead of it")
    # interactive jobs of the same queue, submitted later, started: band 8's list did not move
    delivery.note_started(rds, priority.queue_key(keys.SHARED_QUEUE, 2), old + 30)

    assert lost_messages.resend_lost(rds, app, grace_s=30) == [lost]

    assert rds.llen(band2) == rds.llen(VOID) == 0
    [raw] = rds.lrange(band8, 0, -1)
    message = json.loads(raw)
    assert message["headers"]["id"] == lost and message["properties"]["priority"] == 8
    record = delivery.parse(rds.get(keys.job_delivery(lost)))
    assert record is not None and record.queue == band8
    app.close()


def test_restores_keep_the_band(rds: redis.Redis) -> None:
    tag = uuid.uuid4().hex
    payload = {
        "headers": {"id": "job-b", "task": keys.GENERATE_TASK},
        "properties": {"delivery_tag": tag, "priority": 7, "delivery_info": {}},
    }
    dead = keys.worker_queue("dead@h")
    rds.hset(keys.KOMBU_UNACKED, tag, json.dumps([payload, "", dead]))
    rds.zadd(keys.KOMBU_UNACKED_INDEX, {tag: time.time()})
    assert unacked.restore(rds, tag, dead_queue=dead) == "job-b"
    assert rds.llen(keys.SHARED_QUEUE) == 0
    assert json.loads(rds.lindex(priority.queue_key(keys.SHARED_QUEUE, 7), 0))["headers"]["id"] == "job-b"  # type: ignore[arg-type]


def test_a_dead_workers_queue_moves_band_by_band(rds: redis.Redis) -> None:
    dead = "dead@h"
    for band in (0, 2, 7):
        rds.lpush(priority.queue_key(keys.worker_queue(dead), band), f"m{band}")
    moved, leased = reaper._release(rds, dead)
    assert moved == ["(queued)"] * 3 and leased == 0
    for band in (0, 2, 7):
        assert rds.lrange(priority.queue_key(keys.SHARED_QUEUE, band), 0, -1) == [f"m{band}".encode()]
