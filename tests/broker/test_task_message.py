"""The api's task message (broker/task_message.py) is the one Celery's send_task pushes, and a real
Celery worker runs it and acks it."""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import pytest
import redis
from celery.contrib.testing.worker import start_worker

from broker import keys, priority
from broker.celery_app import BrokerConfig, make_celery
from broker.task_message import check_supported, task_message
from ops.redis.server import RedisServer

JOB = {"prompt": "héllo wörld " * 200, "max_tokens": 8, "seed": 2**63 - 1, "stop": ["\n"]}


@pytest.mark.parametrize(
    ("queue", "band"), [(keys.SHARED_QUEUE, 0), ("kvferry.worker.w1", 0), (keys.SHARED_QUEUE, 7)]
)
def test_the_message_is_send_tasks_own(
    redis_server: RedisServer, rds: redis.Redis, queue: str, band: int
) -> None:
    app = make_celery(BrokerConfig(redis_url=redis_server.url), send_only=True)
    try:
        task_id = str(uuid.uuid4())
        app.send_task(keys.GENERATE_TASK, args=[JOB], task_id=task_id, queue=queue, priority=band)
        assert rds.keys(f"{queue}*") == [priority.queue_key(queue, band).encode()]  # that band only
        sent = json.loads(rds.rpop(priority.queue_key(queue, band)))
        ours = task_message(app, keys.GENERATE_TASK, task_id, [JOB], queue, priority=band)
        built = json.loads(ours.payload)
        assert ours.key == priority.queue_key(queue, band)
        assert built["properties"]["priority"] == band
        assert sent["properties"].pop("delivery_tag") != built["properties"].pop("delivery_tag")
        assert built == sent
    finally:
        app.close()


def test_a_celery_worker_runs_and_acks_it(redis_server: RedisServer, rds: redis.Redis) -> None:
    app = make_celery(BrokerConfig(redis_url=redis_server.url))
    app.conf.task_queues = []  # the worker consumes the queue named below only
    seen: list[tuple[str, Any]] = []
    done = threading.Event()

    @app.task(name="kvferry.test.record", bind=True)
    def record(self: Any, job: dict[str, Any]) -> int:
        seen.append((self.request.id, job))
        done.set()
        return len(job["prompt"])

    queue = "kvferry.test.direct"
    with start_worker(app, pool="threads", concurrency=1, perform_ping_check=False, queues=[queue]):
        task_id = str(uuid.uuid4())
        pushed = task_message(app, "kvferry.test.record", task_id, [JOB], queue)
        rds.lpush(pushed.key, pushed.payload)
        assert done.wait(20)
        assert app.AsyncResult(task_id).get(timeout=10) == len(JOB["prompt"])
    assert seen == [(task_id, JOB)]
    assert rds.llen(queue) == 0
    assert rds.hlen("unacked") == 0  # acked, not waiting for redelivery
    app.close()


@pytest.mark.parametrize(
    "conf",
    [
        {"task_default_priority": 5},
        {"task_routes": {"kvferry.*": {"queue": "elsewhere"}}},
        {"broker_transport_options": {"global_keyprefix": "tenant1:"}},
        {"broker_transport_options": {"priority_steps": [0, 3, 6, 9]}},
        {"broker_transport_options": {"priority_steps": list(range(10)), "sep": ":"}},
    ],
)
def test_a_config_it_would_mis_send_for_is_refused(conf: dict[str, Any]) -> None:
    app = make_celery(BrokerConfig(), send_only=True)
    check_supported(app)  # the project's own configuration
    app.conf.update(conf)
    with pytest.raises(ValueError, match="use send_task"):
        check_supported(app)


def test_a_band_kombu_has_no_list_for_is_refused() -> None:
    app = make_celery(BrokerConfig(), send_only=True)
    with pytest.raises(ValueError, match="band"):
        task_message(app, keys.GENERATE_TASK, "t", [JOB], keys.SHARED_QUEUE, priority=10)
