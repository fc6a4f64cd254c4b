"""The api's Celery app sends jobs without subscribing to their results (it follows the jobs'
own streams), and still reads a task's state; a worker's app keeps Celery's own backend."""

from __future__ import annotations

import uuid

import redis
from celery import states

from broker.celery_app import BrokerConfig, make_celery
from broker.redis.result_backend import SendOnlyRedisBackend, send_only_url
from ops.redis.server import RedisServer

VOID = "kvferry.test.void"  # no worker consumes it


def _subscribers(client: redis.Redis, task_id: str) -> int:
    reply = client.pubsub_numsub(f"celery-task-meta-{task_id}")
    return int(reply[0][1]) if reply else 0


def test_sending_subscribes_to_nothing_and_states_still_read(
    redis_server: RedisServer, rds: redis.Redis
) -> None:
    app = make_celery(BrokerConfig(redis_url=redis_server.url), send_only=True)
    waiting = make_celery(BrokerConfig(redis_url=redis_server.url))  # Celery's own, for contrast
    try:
        assert isinstance(app.backend, SendOnlyRedisBackend)
        assert not isinstance(waiting.backend, SendOnlyRedisBackend)
        sent, held = str(uuid.uuid4()), str(uuid.uuid4())
        app.send_task("kvferry.test.nothing", task_id=sent, queue=VOID)
        handle = waiting.send_task("kvferry.test.nothing", task_id=held, queue=VOID)
        assert _subscribers(rds, sent) == 0
        assert _subscribers(rds, held) == 1  # what Celery's own backend costs the api: one a job
        assert rds.llen(VOID) == 2  # both queued
        waiting.backend.store_result(sent, {"ok": 1}, states.SUCCESS)
        meta = app.backend.get_task_meta(sent, cache=False)
        assert meta["status"] == states.SUCCESS and meta["result"] == {"ok": 1}
        del handle
    finally:
        app.close()
        waiting.close()


def test_other_schemes_keep_their_backend() -> None:
    assert send_only_url("redis://h:1/0").endswith("SendOnlyRedisBackend+redis://h:1/0")
    assert "SendOnlySentinelBackend+sentinel://" in send_only_url("sentinel://a:1;sentinel://b:2")
    assert send_only_url("memory://") == "memory://"
