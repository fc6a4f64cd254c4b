"""A restart of the queue's Redis under a running job: the worker process lives on (it once exited,
with 0, on every restart: broker/redis/transport.py), the job in flight ends token-exact with each
token streamed once to its readers, and the worker takes new jobs afterwards."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis

from broker import keys
from broker.codec import decode_result
from broker.jobs import events as job_events
from broker.messages import JobDone, TokenDelta
from ops.redis.server import RedisServer
from tests.integration.conftest import WorkerProcess, wait_for
from tests.integration.jobs import followed_tokens
from tests.integration.jobs import random_prompt as _prompt
from tests.integration.jobs import send as _send
from tests.integration.jobs import token_job as _job
from tests.integration.test_exactly_once import _raw_events

Reference = Callable[[list[int], int], list[int]]


def _assert_no_gap_and_each_token_once_to_readers(
    client: redis.Redis, job_id: str, expected: list[int]
) -> None:
    """Across a restart a write whose reply was lost is sent again, so the raw stream may hold a
    delta twice: never a gap, never a token that differs from the one at its index, and readers
    (TokenCursor) see each token once."""
    tokens: list[int] = []
    events = _raw_events(client, job_id)
    for event in events[:-1]:
        assert isinstance(event, TokenDelta), event
        assert event.start <= len(tokens), f"a gap: delta at {event.start} after {len(tokens)} tokens"
        overlap = tokens[event.start : event.start + len(event.token_ids)]
        assert list(event.token_ids[: len(overlap)]) == overlap, "a token index written twice, differently"
        tokens.extend(event.token_ids[len(overlap) :])
    assert isinstance(events[-1], JobDone) and tokens == expected
    assert followed_tokens(client, job_id) == expected


def test_a_redis_restart_leaves_the_worker_running_and_its_job_exact(
    worker_factory: Callable[..., WorkerProcess],
    tmp_path_factory: Any,
    tiny_reference: Reference,
) -> None:
    from broker.celery_app import BrokerConfig, make_celery

    data = tmp_path_factory.mktemp("redis-restart")
    with RedisServer(data, persist=True) as server:  # AOF: a restart keeps the job's stream
        app = make_celery(BrokerConfig(redis_url=server.url))
        worker = worker_factory("bounce", redis_url=server.url)
        prompt, n = _prompt(71), 400
        handle = _send(app, _job(prompt, n), worker.queue)
        client = redis.Redis.from_url(server.url)
        wait_for(lambda: bool(client.xlen(keys.job_stream(handle.id))), 60, "the job's first tokens")
        assert not job_events.ended(client, handle.id), "the job ended before the restart: make it longer"
        server.stop()
        time.sleep(0.5)
        server.start()  # same port, same data
        client = redis.Redis.from_url(server.url)
        wait_for(lambda: job_events.ended(client, handle.id), 120, "the job in flight to end")
        _assert_no_gap_and_each_token_once_to_readers(client, handle.id, tiny_reference(prompt, n))
        time.sleep(2.0)  # the consumer has reconnected (or died) by now
        assert worker.process.poll() is None, f"the worker exited: {worker.log.read_text()[-3000:]}"
        after = _prompt(72)
        result = decode_result(_send(app, _job(after, 8), worker.queue).get(timeout=60))
        assert list(result.token_ids) == tiny_reference(after, 8)
        assert worker.process.poll() is None
        worker.stop()
