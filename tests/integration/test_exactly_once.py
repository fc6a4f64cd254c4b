"""Exactly-once jobs under faults, with real redis-server and real worker processes: liveness off
the engine, job leases with fencing, each token once, redelivery after SIGKILL and engine crash."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from broker import keys
from broker.codec import decode_event, decode_result
from broker.jobs import events as job_events
from broker.jobs.events import FencedStream, TokenCursor
from broker.jobs.lease import JobLeases, Lease, StaleLeaseError
from broker.messages import JobDone, StreamEvent, TokenDelta
from tests.integration.conftest import WorkerProcess, wait_for
from tests.integration.jobs import followed_tokens, start_lease
from tests.integration.jobs import random_prompt as _prompt
from tests.integration.jobs import send as _send
from tests.integration.jobs import token_job as _job

Reference = Callable[[list[int], int], list[int]]


def _raw_events(client: redis.Redis, job_id: str) -> list[StreamEvent]:
    entries: Any = client.xrange(keys.job_stream(job_id))
    return [decode_event(fields[job_events.EVENT_FIELD]) for _, fields in entries]


def _assert_each_token_once(client: redis.Redis, job_id: str, expected: list[int]) -> set[int]:
    """The raw stream (not a reader's view) holds every index once, contiguous, in order, and one
    final event; returns the epochs that wrote tokens."""
    events = _raw_events(client, job_id)
    tokens: list[int] = []
    epochs = set()
    for event in events[:-1]:
        assert isinstance(event, TokenDelta), event
        assert event.start == len(tokens), f"delta at {event.start} after {len(tokens)} tokens"
        tokens.extend(event.token_ids)
        epochs.add(event.epoch)
    assert isinstance(events[-1], JobDone) and tokens == expected
    assert followed_tokens(client, job_id) == expected
    return epochs


# -- unit level, against real Redis ---------------------------------------------------------------


def test_zombie_write_with_an_old_epoch_is_refused(redis_client: redis.Redis) -> None:
    job_id, tenant = f"zombie-{uuid.uuid4().hex[:8]}", "t-zombie"
    leases, stream = JobLeases(redis_client, ttl_s=5), FencedStream(redis_client)
    redis_client.zadd(keys.tenant_jobs(tenant), {job_id: time.time() + 60})
    first = start_lease(leases, job_id, "a@h|1")
    assert isinstance(first, Lease) and first.epoch == 1
    stream.publish(job_id, tenant, TokenDelta("ab", (1, 2), 0, 0, first.epoch))
    held = start_lease(leases, job_id, "b@h|2")  # a live lease: nobody else gets it
    assert not isinstance(held, Lease) and held.worker == "a@h" and held.epoch == 1
    redis_client.delete(keys.job_lease(job_id))  # a's lease lapses (a paused past its TTL)
    second = start_lease(leases, job_id, "b@h|2")
    assert isinstance(second, Lease) and second.epoch == 2
    with pytest.raises(StaleLeaseError):
        stream.publish(job_id, tenant, TokenDelta("c", (3,), 2, 2, first.epoch))  # the zombie
    assert not leases.renew(first) and not leases.release(first)
    assert leases.renew(second)
    stream.publish(job_id, tenant, TokenDelta("c", (3,), 2, 2, second.epoch))
    assert redis_client.zscore(keys.tenant_jobs(tenant), job_id) is not None
    result = job_events.progress(redis_client, job_id)
    assert result.token_ids == (1, 2, 3) and result.text_chars == 3 and not result.final
    assert leases.release(second) and leases.holder(job_id) is None
    assert [e.epoch for e in _raw_events(redis_client, job_id)] == [1, 2]
    redis_client.delete(keys.worker_jobs("a@h"), keys.worker_jobs("b@h"))


def test_token_cursor_shows_each_index_once() -> None:
    cursor = TokenCursor()
    shown = [
        cursor.accept(e)
        for e in (
            TokenDelta("ab", (1, 2), 0, 0, 1),
            TokenDelta("bc", (2, 3), 1, 1, 2),  # a redelivery overlapping by one token
            TokenDelta("c", (3,), 2, 2, 2),  # nothing new
            TokenDelta("d", (4,)),  # no index: follows the previous delta
        )
    ]
    assert shown[2] is None
    kept = [e for e in shown if isinstance(e, TokenDelta)]
    assert [t for e in kept for t in e.token_ids] == [1, 2, 3, 4]
    assert "".join(e.text for e in kept) == "abcd" and [e.start for e in kept] == [0, 2, 3]


# -- real workers ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slow_worker(start_worker: Callable[..., WorkerProcess]) -> Iterator[WorkerProcess]:
    """A worker whose prefill steps take 8 s longer (the engine's test hook)."""
    worker = start_worker("slow", "--debug-slow-step-s", "8")
    yield worker
    worker.stop()


def test_an_8s_step_keeps_the_heartbeat_and_no_job_is_reaped(
    two_workers: tuple[WorkerProcess, WorkerProcess],
    slow_worker: WorkerProcess,
    celery_app: Any,
    redis_client: redis.Redis,
    tiny_reference: Reference,
) -> None:
    prompt = _prompt(11)
    handle = _send(celery_app, _job(prompt, 6), slow_worker.queue)
    key = keys.worker_heartbeat(slow_worker.name)
    missing = 0
    samples = 0
    while not handle.ready():
        samples += 1
        missing += not redis_client.exists(key)
        time.sleep(0.1)
    result = decode_result(handle.get(timeout=5))
    assert samples > 50, "the step did not take long"
    assert missing == 0, f"the heartbeat key was missing in {missing} of {samples} samples"
    assert result.worker == slow_worker.name and list(result.token_ids) == tiny_reference(prompt, 6)
    assert int(redis_client.get(keys.job_epoch(handle.id)) or 0) == 1
    assert _assert_each_token_once(redis_client, handle.id, list(result.token_ids)) == {1}


def test_a_stale_heartbeat_does_not_run_the_job_twice(
    two_workers: tuple[WorkerProcess, WorkerProcess],
    slow_worker: WorkerProcess,
    celery_app: Any,
    redis_client: redis.Redis,
    tiny_reference: Reference,
) -> None:
    prompt = _prompt(12)
    handle = _send(celery_app, _job(prompt, 8), slow_worker.queue)
    wait_for(lambda: redis_client.exists(keys.job_lease(handle.id)) == 1, 30, "the job's lease")
    stop = threading.Event()

    def delete_heartbeat() -> None:  # the others' reapers see a dead worker, again and again
        while not stop.is_set():
            redis_client.delete(keys.worker_heartbeat(slow_worker.name))
            time.sleep(0.02)

    thread = threading.Thread(target=delete_heartbeat, daemon=True)
    thread.start()
    try:
        result = decode_result(handle.get(timeout=60))
    finally:
        stop.set()
        thread.join()
    assert result.worker == slow_worker.name and list(result.token_ids) == tiny_reference(prompt, 8)
    assert int(redis_client.get(keys.job_epoch(handle.id)) or 0) == 1
    assert _assert_each_token_once(redis_client, handle.id, list(result.token_ids)) == {1}


def test_sigkill_mid_generation_finishes_elsewhere_each_token_once(
    two_workers: tuple[WorkerProcess, WorkerProcess],
    worker_factory: Callable[..., WorkerProcess],
    celery_app: Any,
    redis_client: redis.Redis,
    tiny_reference: Reference,
) -> None:
    victim = worker_factory("victim2")
    prompt = _prompt(13, 70)
    handle = _send(celery_app, _job(prompt, 300), victim.queue)  # killed after its 5th token
    seen = 0
    for event in job_events.follow(redis_client, handle.id, timeout_s=60):
        assert isinstance(event, TokenDelta), event
        seen += len(event.token_ids)
        if seen >= 5:
            break
    victim.kill()
    killed_at = time.monotonic()
    result = decode_result(handle.get(timeout=120))
    took = time.monotonic() - killed_at
    assert result.worker != victim.name  # any other live worker (this module's slow one too)
    assert list(result.token_ids) == tiny_reference(prompt, 300)
    epochs = _assert_each_token_once(redis_client, handle.id, list(result.token_ids))
    assert epochs == {1, 2}, epochs
    # prompt + what the victim had streamed: nothing of it was in the new worker's pool or Redis
    assert 0 < result.usage.recomputed_tokens <= len(prompt) + 300, result.usage
    print(f"\nredelivered after SIGKILL in {took:.2f}s; recomputed {result.usage.recomputed_tokens} tokens")


def test_engine_crash_redelivers_in_flight_jobs_exact(
    two_workers: tuple[WorkerProcess, WorkerProcess],
    worker_factory: Callable[..., WorkerProcess],
    celery_app: Any,
    redis_client: redis.Redis,
    tiny_reference: Reference,
) -> None:
    crashy = worker_factory("crashy", "--debug-crash-step", "6")
    prompts = [_prompt(20 + i, 30) for i in range(3)]
    handles = [_send(celery_app, _job(p, 24), crashy.queue) for p in prompts]
    results = [decode_result(h.get(timeout=90)) for h in handles]
    epochs = []
    for prompt, handle, result in zip(prompts, handles, results, strict=True):
        assert list(result.token_ids) == tiny_reference(prompt, 24)
        _assert_each_token_once(redis_client, handle.id, list(result.token_ids))
        epochs.append(int(redis_client.get(keys.job_epoch(handle.id)) or 0))
        assert handle.state == "SUCCESS"
    assert max(epochs) >= 2, f"no job was redelivered (epochs {epochs}): did the step crash?"
    assert "engine step failed" in crashy.log.read_text()
