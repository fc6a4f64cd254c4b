"""Poison jobs (seed 2**64, temperature 1e-300, ...) sent with send_task, bypassing the api's checks,
next to 6 streaming jobs on the same worker: only the poison fails, with a 400 in its stream; the 6
finish token-exact and each token arrives once. A job naming a field kvferry does not implement is
refused the same way, never run without it."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis

from broker import keys
from broker.codec import decode_result, encode_job
from broker.jobs import events as job_events
from broker.messages import GenerateJob, JobDone, JobFailed, TokenDelta
from broker.sampling import SamplingParams
from tests.integration.conftest import MODEL, WorkerProcess

Reference = Callable[[list[int], int], list[int]]


def _send(app: Any, payload: dict[str, Any], queue: str) -> Any:
    return app.send_task(keys.GENERATE_TASK, args=[payload], task_id=str(uuid.uuid4()), queue=queue)


def test_poison_fails_alone(
    two_workers: tuple[WorkerProcess, WorkerProcess],
    celery_app: Any,
    redis_client: redis.Redis,
    tiny_reference: Reference,
) -> None:
    w1 = two_workers[0]
    rng = random.Random(77)
    prompts = [[rng.randrange(100, 49152) for _ in range(rng.randrange(10, 40))] for _ in range(6)]
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    good = [
        _send(
            celery_app,
            encode_job(
                GenerateJob(MODEL, prompt_token_ids=tuple(p), params=params, submitted_at=time.time())
            ),
            w1.queue,
        )
        for p in prompts
    ]
    poisons = []
    for field, value in (
        ("seed", 2**64),
        ("temperature", 1e-300),
        ("repetition_penalty", 0),
        ("logit_bias", [[49152, 1.0]]),  # past the vocabulary: the worker's admission refuses it
    ):
        payload = encode_job(GenerateJob(MODEL, prompt_token_ids=tuple(prompts[0]), params=params))
        payload["params"][field] = value  # what the api would refuse; a raw producer can send it
        poisons.append((field, _send(celery_app, payload, w1.queue)))
    for field, handle in poisons:
        events = list(job_events.follow(redis_client, handle.id, timeout_s=60))
        assert isinstance(events[-1], JobFailed), events
        assert events[-1].status_code == 400 and events[-1].param == field, events[-1]
    for prompt, handle in zip(prompts, good, strict=True):
        events = list(job_events.follow(redis_client, handle.id, timeout_s=120))
        result = decode_result(handle.get(timeout=60))
        assert list(result.token_ids) == tiny_reference(prompt, 16)
        streamed = [t for e in events if isinstance(e, TokenDelta) for t in e.token_ids]
        assert streamed == list(result.token_ids)  # each token once, in order
        assert isinstance(events[-1], JobDone) and result.worker == w1.name


def test_unknown_fields_are_refused_not_ignored(
    two_workers: tuple[WorkerProcess, WorkerProcess], celery_app: Any, redis_client: redis.Redis
) -> None:
    job = GenerateJob(MODEL, prompt_token_ids=(100, 101, 102), params=SamplingParams(max_tokens=4))
    top = {**encode_job(job), "logprobs": True}
    nested = encode_job(job)
    nested["params"]["beam_width"] = 4
    for payload, field in ((top, "logprobs"), (nested, "beam_width")):
        handle = _send(celery_app, payload, two_workers[0].queue)
        events = list(job_events.follow(redis_client, handle.id, timeout_s=60))
        assert [type(e) for e in events] == [JobFailed], events  # nothing ran
        failed = events[-1]
        assert isinstance(failed, JobFailed) and failed.status_code == 400
        assert field in failed.message, failed.message
