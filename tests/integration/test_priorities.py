"""Priorities through a real worker (broker/priority.py): jobs queued before the worker starts, on
its own queue and on the shared one, are started interactive first, lower priority first, batch
lines last in the order they came, whichever of its queues holds them (kombu's band lists are
BRPOPed band-major across queues); and interactive and batch jobs mixed on one worker, with
batch sequences yielding seats to interactive ones, all answer token-exact with HF generate."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis

from broker import keys, priority
from broker.celery_app import BrokerConfig, make_celery
from broker.codec import decode_result, encode_job
from broker.messages import GenerateJob
from ops.redis.server import RedisServer
from tests.integration.conftest import WorkerProcess, wait_for
from tests.integration.jobs import random_prompt, token_job
from workers.process.main import node_name

Reference = Callable[[list[int], int], list[int]]


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A queue Redis of this test's own: no other test's worker takes its jobs."""
    with RedisServer(tmp_path / "redis") as server:
        yield server


def _job(seed: int, job_class: priority.JobClass, prio: int, max_tokens: int = 6) -> GenerateJob:
    base = token_job(random_prompt(seed, 24), max_tokens)
    return msgspec.structs.replace(
        base, job_class=job_class, priority=prio, batch_id="b1" if job_class == "batch" else ""
    )


def _send(app: Any, job: GenerateJob, queue: str) -> str:
    job_id = str(uuid.uuid4())
    band = priority.job_band(job)
    app.send_task(keys.GENERATE_TASK, args=[encode_job(job)], task_id=job_id, queue=queue, priority=band)
    return job_id


def test_a_worker_starts_interactive_jobs_first(
    own_redis: RedisServer, worker_factory: Callable[..., WorkerProcess]
) -> None:
    client = redis.Redis.from_url(own_redis.url)
    app = make_celery(BrokerConfig(redis_url=own_redis.url))
    name = f"prio-{uuid.uuid4().hex[:6]}"
    own = keys.worker_queue(node_name(name))
    sent: dict[str, str] = {}
    for i in range(3):  # batch lines first, on the worker's own queue
        sent[f"b{i}"] = _send(app, _job(i, "batch", 0), own)
    sent["i+2"] = _send(app, _job(10, "interactive", 2), own)
    sent["i0"] = _send(app, _job(11, "interactive", 0), keys.SHARED_QUEUE)
    sent["i-1"] = _send(app, _job(12, "interactive", -1), keys.SHARED_QUEUE)
    worker_factory(name, "--concurrency", "1", redis_url=own_redis.url)  # one job at a time

    for job_id in sent.values():
        decode_result(app.AsyncResult(job_id).get(timeout=120))
    leased = {n: float(client.hget(keys.job_stages(j), "leased")) for n, j in sent.items()}  # type: ignore[arg-type]
    assert sorted(leased, key=leased.__getitem__) == ["i-1", "i0", "i+2", "b0", "b1", "b2"], leased
    app.close()


def test_mixed_classes_on_one_worker_are_token_exact(
    own_redis: RedisServer, worker_factory: Callable[..., WorkerProcess], tiny_reference: Reference
) -> None:
    app = make_celery(BrokerConfig(redis_url=own_redis.url))
    worker_factory("mixed", "--max-num-seqs", "2", redis_url=own_redis.url)  # batch seats yield
    jobs: dict[str, GenerateJob] = {}
    ids: dict[str, str] = {}
    for i in range(4):
        jobs[f"b{i}"] = _job(100 + i, "batch", i - 1, max_tokens=48)
        ids[f"b{i}"] = _send(app, jobs[f"b{i}"], keys.SHARED_QUEUE)
    client = redis.Redis.from_url(own_redis.url)
    wait_for(lambda: client.xlen(keys.job_stream(ids["b0"])) > 0, 60, "a batch line to run")
    for i, prio in enumerate((0, -2, 3)):
        jobs[f"i{i}"] = _job(200 + i, "interactive", prio, max_tokens=10)
        ids[f"i{i}"] = _send(app, jobs[f"i{i}"], keys.SHARED_QUEUE)
    for name, job_id in ids.items():
        result = decode_result(app.AsyncResult(job_id).get(timeout=180))
        job = jobs[name]
        want = tiny_reference(list(job.prompt_token_ids), job.params.max_tokens or 0)
        assert list(result.token_ids) == want, name
    app.close()
