"""A worker SIGKILLed while its KV writer waits for an idle engine (workers/tiers/writer_yield.py): the
writes it deferred are lost as cache only. No job is lost or run wrong, a session's turn is in Redis
before its record says so (a record waiting for its writes overrides the deferral), and no pin
is left behind."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import redis

from broker import keys
from broker.codec import decode_result
from broker.jobs import events as job_events
from broker.messages import TokenDelta
from kvstore.redis.report import read_report
from tests.integration.conftest import WorkerProcess
from tests.integration.jobs import chat, random_prompt, send, token_job, wait_settled
from tests.integration.test_sessions import _continued

Reference = Callable[[list[int], int], list[int]]


def test_a_worker_killed_with_writes_deferred_loses_no_job_and_no_session(
    two_workers: tuple[WorkerProcess, WorkerProcess],
    worker_factory: Callable[..., WorkerProcess],
    celery_app: Any,
    redis_client: redis.Redis,
    tiny_reference: Reference,
) -> None:
    doomed = worker_factory("deferring", "--kv-write-defer", "300")  # never idle long enough to write
    survivors = {w.name for w in two_workers}
    tag = uuid.uuid4().hex[:8]
    busy_prompt = random_prompt(4711, 20)
    # keeps the engine stepping: some 30-50 of its tokens are out when the turns are done and the
    # worker dies, so 300 outlast them; each costs a redelivered step and an HF reference step
    busy = send(celery_app, token_job(busy_prompt, 300), doomed.queue)
    for event in job_events.follow(redis_client, busy.id, timeout_s=60):
        assert isinstance(event, TokenDelta), event
        break

    # A session's turn: SessionKeeper orders its full record after the turn's writes, and the writer
    # does not defer while a record waits, so the turn's blocks reach Redis while the engine is busy.
    session = f"deferred-{tag}"
    system = f"Deferred writes {tag}. " * 10
    turn1 = [{"role": "system", "content": system}, {"role": "user", "content": "one"}]
    r1 = chat(celery_app, turn1, session, doomed.queue)
    # A plain prompt after it: its write-through waits for an idle engine that never comes.
    plain = random_prompt(4712, 70)
    r_plain = decode_result(send(celery_app, token_job(plain, 4), doomed.queue).get(timeout=120))
    assert r1.worker == doomed.name and r_plain.worker == doomed.name
    assert list(r_plain.token_ids) == tiny_reference(plain, 4)
    assert not busy.ready(), "the busy job must outlast the turns (the engine never went idle)"
    wait_settled(redis_client, "", session)  # the turn's record and pins, just after its answer
    doomed.kill()

    # The job the kill interrupted runs again elsewhere, token-exact.
    result = decode_result(busy.get(timeout=180))
    assert result.worker in survivors
    assert list(result.token_ids) == tiny_reference(busy_prompt, 300), result.usage
    # The plain prompt's deferred write died with the worker: computed again, token-exact.
    again_prompt = [*plain, 101, 102]
    again = decode_result(send(celery_app, token_job(again_prompt, 4), keys.SHARED_QUEUE).get(timeout=120))
    assert again.worker in survivors and again.usage.redis_tokens == 0, again.usage
    assert list(again.token_ids) == tiny_reference(again_prompt, 4)
    # The session's next turn resumes from Redis on another worker, token-exact.
    turn2 = [*turn1, {"role": "assistant", "content": r1.text}, {"role": "user", "content": "two"}]
    r2 = chat(celery_app, turn2, session, keys.SHARED_QUEUE)
    assert r2.worker in survivors and r2.usage.redis_tokens > 0, r2.usage
    assert list(r2.token_ids) == _continued(redis_client, session, r2, tiny_reference)

    assert read_report(redis_client, redis_client)["orphan_pins"] == 0
    # asked of the survivors only, back as soon as both answered (not at the timeout)
    answers = celery_app.control.broadcast(
        "kvferry_integrity", destination=sorted(survivors), reply=True, timeout=15, limit=len(survivors)
    )
    checked = {node: a for answer in answers for node, a in answer.items() if node in survivors}
    assert set(checked) == survivors and all(a["ok"] for a in checked.values()), checked
