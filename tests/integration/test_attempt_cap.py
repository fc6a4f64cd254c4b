"""The attempt cap counts engine failures, not lease takes. Real workers whose engine step crashes
once (--debug-crash-step 2: the second step, which a job running alone is sure to be in) fail the
job they run: one whose epoch is already high (nine lease takes, as worker deaths and takeovers
leave it) is redelivered and finishes token-exact; one whose engine already failed
MAX_ATTEMPTS - 1 times ends failed, with a 500 in its stream."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis

from broker import keys
from broker.codec import decode_result, encode_job
from broker.jobs import events as job_events
from broker.messages import JobFailed
from tests.integration.conftest import WorkerProcess
from tests.integration.jobs import followed_tokens, random_prompt, token_job
from workers.jobs.runner import MAX_ATTEMPTS

Reference = Callable[[list[int], int], list[int]]


def test_lease_takes_do_not_use_up_the_engine_failure_budget(
    worker_factory: Callable[..., WorkerProcess],
    celery_app: Any,
    redis_client: redis.Redis,
    tiny_reference: Reference,
) -> None:
    retaken, poison = str(uuid.uuid4()), str(uuid.uuid4())
    redis_client.set(keys.job_epoch(retaken), 9, ex=600)  # nine lease takes before this one
    redis_client.set(keys.job_engine_failures(poison), MAX_ATTEMPTS - 1, ex=600)
    prompts = {retaken: random_prompt(61, 30), poison: random_prompt(62, 30)}
    handles = {}
    for job_id, name in ((retaken, "capped"), (poison, "poisoned")):  # each alone on its own worker
        args = [encode_job(token_job(prompts[job_id], 24))]
        queue = worker_factory(name, "--debug-crash-step", "2").queue
        handles[job_id] = celery_app.send_task(keys.GENERATE_TASK, args=args, task_id=job_id, queue=queue)
    result = decode_result(handles[retaken].get(timeout=90))
    assert list(result.token_ids) == tiny_reference(prompts[retaken], 24)
    assert followed_tokens(redis_client, retaken) == list(result.token_ids)
    assert int(redis_client.get(keys.job_epoch(retaken)) or 0) >= 11, "the crash did not redeliver it"
    assert int(redis_client.get(keys.job_engine_failures(retaken)) or 0) == 1
    with pytest.raises(Exception):  # noqa: B017 - Celery re-raises the task's error by its own type
        handles[poison].get(timeout=90)
    final = job_events.progress(redis_client, poison).failed
    assert isinstance(final, JobFailed) and final.status_code == 500, final
    assert f"failed {MAX_ATTEMPTS} attempts" in final.message
