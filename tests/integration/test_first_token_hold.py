"""A worker's job publishes its first token, then tells the engine loop so (handle.first_out()): the
loop holds its next step at most `--first-token-hold` for that. With a 60 s hold, a streamed job
that finishes in seconds shows the worker's job path reports it; tokens stay exact."""

from __future__ import annotations

import time
from collections.abc import Callable

import redis

from broker.codec import decode_result
from tests.integration import jobs
from tests.integration.conftest import WorkerProcess


def test_the_job_path_reports_its_first_token(
    worker_factory: Callable[..., WorkerProcess],
    celery_app: object,
    redis_client: redis.Redis,
    tiny_reference: Callable[[list[int], int], list[int]],
) -> None:
    worker = worker_factory("holding", "--first-token-hold", "60")
    prompt = jobs.random_prompt(seed=41, n=24)
    started = time.monotonic()
    result = decode_result(
        jobs.send(celery_app, jobs.token_job(prompt, 12), queue=worker.queue).get(timeout=30)
    )
    assert time.monotonic() - started < 30, "the engine held its next step for the whole hold"
    assert list(result.token_ids) == tiny_reference(prompt, 12)
    assert jobs.followed_tokens(redis_client, result.job_id) == list(result.token_ids)
