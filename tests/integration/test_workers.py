"""Celery workers over real Redis: the public task, batching, queues, bad jobs, a SIGKILLed worker."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
import redis

from broker.codec import decode_result
from broker.jobs import events as job_events
from broker.messages import GenerateJob, JobDone, JobFailed, TokenDelta
from broker.worker_registry import live_workers
from tests.integration.conftest import MODEL, WorkerProcess, wait_for
from tests.integration.jobs import send as _send
from tests.integration.jobs import token_job as _job

Reference = Callable[[list[int], int], list[int]]


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 49152) for _ in range(rng.randrange(5, 60))] for _ in range(n)]


def test_python_producer_send_task_is_token_exact(
    two_workers: tuple[WorkerProcess, WorkerProcess],
    celery_app: Any,
    redis_client: redis.Redis,
    tiny_reference: Reference,
) -> None:
    prompt = _prompts(1, 1)[0]
    handle = _send(celery_app, _job(prompt, 12))
    events = list(job_events.follow(redis_client, handle.id, timeout_s=60))
    result = decode_result(handle.get(timeout=60))
    assert list(result.token_ids) == tiny_reference(prompt, 12)
    streamed = [t for e in events if isinstance(e, TokenDelta) for t in e.token_ids]
    assert streamed == list(result.token_ids)
    assert isinstance(events[-1], JobDone) and events[-1].result == result
    assert result.usage.prompt_tokens == len(prompt) and result.usage.completion_tokens == 12
    assert result.worker in {w.name for w in two_workers}
    assert result.finish_reason == "length" and result.ttft_s <= result.latency_s


def test_concurrent_jobs_on_one_worker_are_batched(
    two_workers: tuple[WorkerProcess, WorkerProcess],
    celery_app: Any,
    redis_client: redis.Redis,
    tiny_reference: Reference,
) -> None:
    w1 = two_workers[0]
    before = next(w for w in live_workers(redis_client) if w.name == w1.name).engine
    assert before is not None
    prompts = _prompts(8, 2)
    handles = [_send(celery_app, _job(p, 24), queue=w1.queue) for p in prompts]
    results = [decode_result(h.get(timeout=120)) for h in handles]
    for prompt, result in zip(prompts, results, strict=True):
        assert result.worker == w1.name
        assert list(result.token_ids) == tiny_reference(prompt, 24), f"prompt of {len(prompt)} tokens"

    def batched() -> bool:
        now = next(w for w in live_workers(redis_client) if w.name == w1.name).engine
        return now is not None and now.generation_tokens >= before.generation_tokens + 8 * 24

    wait_for(batched, 10, "a heartbeat after the jobs")
    after = next(w for w in live_workers(redis_client) if w.name == w1.name).engine
    assert after is not None and after.max_batch_seqs > 1, "concurrent jobs did not share engine steps"
    # 8 jobs x 24 tokens in far fewer steps than 8 x 24 one-at-a-time steps.
    assert after.num_steps - before.num_steps < 8 * 24


def test_shared_queue_is_served_by_both_workers(
    two_workers: tuple[WorkerProcess, WorkerProcess], celery_app: Any
) -> None:
    handles = [_send(celery_app, _job(p, 4)) for p in _prompts(48, 3)]
    workers = {decode_result(h.get(timeout=180)).worker for h in handles}
    assert workers == {w.name for w in two_workers}


def test_job_sent_to_a_worker_queue_runs_there(
    two_workers: tuple[WorkerProcess, WorkerProcess], celery_app: Any
) -> None:
    for worker in two_workers:
        for prompt in _prompts(3, 4):
            assert decode_result(
                _send(celery_app, _job(prompt, 3), queue=worker.queue).get(timeout=60)
            ).worker == (worker.name)


@pytest.mark.parametrize(
    ("job", "status", "error_type"),
    [
        (_job(list(range(100, 1100)), 100), 400, "invalid_request_error"),  # 1,000 + 100 > 1,024 context
        (_job([5, 6, 7], 4, model="not-this-model"), 404, "not_found_error"),
        (GenerateJob(model=MODEL, endpoint="completion", prompt=None), 400, "invalid_request_error"),
    ],
)
def test_bad_jobs_fail_with_typed_errors(
    two_workers: tuple[WorkerProcess, WorkerProcess],
    celery_app: Any,
    redis_client: redis.Redis,
    job: GenerateJob,
    status: int,
    error_type: str,
) -> None:
    handle = _send(celery_app, job)
    events = list(job_events.follow(redis_client, handle.id, timeout_s=60))
    assert isinstance(events[-1], JobFailed), events
    assert (events[-1].status_code, events[-1].error_type) == (status, error_type)
    with pytest.raises(Exception, match=r"model|context|prompt|empty"):
        handle.get(timeout=30)
    assert handle.state == "FAILURE"


def test_sigkilled_worker_job_completes_on_another_worker(
    two_workers: tuple[WorkerProcess, WorkerProcess],
    worker_factory: Callable[..., WorkerProcess],
    celery_app: Any,
    redis_client: redis.Redis,
    tiny_reference: Reference,
) -> None:
    victim = worker_factory("victim")
    prompt = _prompts(1, 5)[0]
    handle = _send(celery_app, _job(prompt, 300), queue=victim.queue)  # killed after its 5th token
    seen: list[int] = []
    for event in job_events.follow(redis_client, handle.id, timeout_s=60):
        assert isinstance(event, TokenDelta), event
        seen.extend(event.token_ids)
        if len(seen) >= 5:
            break
    victim.kill()
    killed_at = time.monotonic()
    result = decode_result(handle.get(timeout=120))
    redelivered_after = time.monotonic() - killed_at
    assert result.worker in {w.name for w in two_workers}
    assert list(result.token_ids) == tiny_reference(prompt, 300)
    # The stream holds each token once: the new worker resumed after what the victim had sent.
    streamed = [
        t
        for e in job_events.follow(redis_client, handle.id, timeout_s=5)
        if isinstance(e, TokenDelta)
        for t in e.token_ids
    ]
    assert streamed == list(result.token_ids)
    assert redelivered_after < 30, f"redelivery took {redelivered_after:.1f}s"
    print(f"\nSIGKILLed worker's job finished {redelivered_after:.2f}s after the kill")


def test_a_sigkilled_logprobs_job_streams_each_logprob_once(
    two_workers: tuple[WorkerProcess, WorkerProcess],
    worker_factory: Callable[..., WorkerProcess],
    celery_app: Any,
    redis_client: redis.Redis,
    tiny_reference: Reference,
) -> None:
    """Redelivered after its worker's SIGKILL, a job asking for output and prompt logprobs ends
    exact, its stream holding each token's logprob once and the prompt's once."""
    victim = worker_factory("victim-lp")
    prompt = _prompts(1, 6)[0]
    base = _job(prompt, 300)  # killed after its 5th token
    params = msgspec.structs.replace(base.params, logprobs=2, prompt_logprobs=1)
    handle = _send(celery_app, msgspec.structs.replace(base, params=params), queue=victim.queue)
    seen = 0
    for event in job_events.follow(redis_client, handle.id, timeout_s=60):
        assert isinstance(event, TokenDelta), event
        seen += len(event.token_ids)
        if seen >= 5:
            break
    victim.kill()
    result = decode_result(handle.get(timeout=120))
    assert list(result.token_ids) == tiny_reference(prompt, 300)
    assert [lp.token_id for lp in result.logprobs] == list(result.token_ids)
    assert [lp.token_id for lp in result.prompt_logprobs] == prompt
    deltas = [e for e in job_events.follow(redis_client, handle.id, timeout_s=5) if isinstance(e, TokenDelta)]
    assert [lp.token_id for e in deltas for lp in e.logprobs] == list(result.token_ids)
    assert [len(e.prompt_logprobs) for e in deltas if e.prompt_logprobs] == [len(prompt)]
