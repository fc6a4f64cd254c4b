"""Scale-out that pays at once (workers/tiers/warm_start.py), with real processes: a worker
started after sessions exist loads their blocks from the Redis tier before it takes any message,
so a moved session's next turn is served from its own warm tier, with nothing read from Redis at
request time. The moved turns wait in the new worker's queue before it starts: a worker that
consumed before its warm start would fetch their blocks at request time (redis_tokens > 0)."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable
from typing import Any

import redis

from broker import keys
from broker.codec import decode_result
from broker.messages import ChatMessage
from broker.worker_registry import live_workers
from kvstore.redis.report import read_report
from tests.integration.conftest import WorkerProcess
from tests.integration.jobs import BLOCK_SIZE, send, wait_settled
from tests.integration.test_drain import turn

SESSIONS = 4


def test_a_new_worker_warms_the_hottest_sessions_before_it_takes_their_moved_turns(
    celery_app: Any, redis_client: redis.Redis, worker_factory: Callable[..., WorkerProcess]
) -> None:
    w1 = worker_factory("warm-a")
    history: dict[str, tuple[ChatMessage, ...]] = {}
    so_far: tuple[ChatMessage, ...]
    seen: dict[str, int] = {}
    for i in range(SESSIONS):
        s, so_far = f"warm-{uuid.uuid4().hex[:8]}", ()
        for t in range(2):
            question = f"question {t} of session {i}, {s}"
            res = decode_result(send(celery_app, turn(s, question, 24, so_far), w1.queue).get(timeout=120))
            assert res.worker == w1.name
            so_far = (*so_far, ChatMessage("user", question), ChatMessage("assistant", res.text))
            wait_settled(redis_client, "", s)
        history[s] = so_far
        seen[s] = res.usage.prompt_tokens + res.usage.completion_tokens
    # the moved turns, queued for the new worker before it exists
    name = "warm-b"
    queue = keys.worker_queue(f"{name}@{socket.gethostname()}")
    pending = {s: send(celery_app, turn(s, f"next question of {s}", 4, h), queue) for s, h in history.items()}
    hits_before = read_report(redis_client, redis_client)["hits"]
    w2 = worker_factory(name, "--warm-start-size", "64M")
    assert w2.queue == queue
    status = next(w for w in live_workers(redis_client) if w.name == w2.name)
    # its first heartbeat already tells of the warm start: it ran before the consumer
    assert status.warm_start_blocks >= sum(n // BLOCK_SIZE for n in seen.values()) // 2
    results = {s: decode_result(p.get(timeout=120)) for s, p in pending.items()}
    short = []
    for s, res in results.items():
        assert res.worker == w2.name
        u = res.usage
        if u.redis_tokens or u.cached_tokens < seen[s] - BLOCK_SIZE:
            short.append((s, u, seen[s]))
    assert not short  # each moved turn: history cached (>= one block short), none of it from Redis
    # the blocks the new worker found in Redis, it found at its start: the turns read none
    assert read_report(redis_client, redis_client)["hits"] - hits_before == status.warm_start_blocks
