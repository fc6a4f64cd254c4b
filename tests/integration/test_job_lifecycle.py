"""The job lifecycle around the lease: the reaper waits for a dead worker's leases to lapse, a
worker restarted under its old name hands its previous life's jobs back at once, a dead engine
loop makes the worker exit, and the job time limit holds."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis

from broker import keys, priority
from broker.codec import encode_job
from broker.jobs import delivery
from broker.jobs import events as job_events
from broker.jobs.lease import JobLeases, Lease, make_owner
from broker.messages import GenerateJob, JobFailed
from broker.sampling import SamplingParams
from broker.worker_registry import live_workers
from tests.integration.conftest import MODEL, WorkerProcess, wait_for
from tests.integration.jobs import start_lease
from workers.jobs import reaper
from workers.process.supervisor import EXIT_CODE, Supervisor

VOID = "kvferry.test.void"  # a queue no worker consumes: these fake messages have no body


def _fake_unacked(client: redis.Redis, job_id: str, routing_key: str) -> str:
    """A delivered-but-unacked message as kombu's Redis transport keeps it."""
    tag = uuid.uuid4().hex
    payload = {"headers": {"id": job_id, "task": keys.GENERATE_TASK}, "properties": {"delivery_tag": tag}}
    client.hset(keys.KOMBU_UNACKED, tag, json.dumps([payload, routing_key, routing_key]))
    client.zadd(keys.KOMBU_UNACKED_INDEX, {tag: time.time()})
    return tag


def _queued_ids(client: redis.Redis, queue: str) -> list[str]:
    raw: Any = client.lrange(queue, 0, -1)
    return [json.loads(m)["headers"]["id"] for m in raw]


def test_reaper_waits_for_the_dead_workers_lease(redis_client: redis.Redis) -> None:
    dead, job_id = f"dead-{uuid.uuid4().hex[:6]}@h", f"job-{uuid.uuid4().hex[:8]}"
    leases = JobLeases(redis_client, ttl_s=30)
    redis_client.sadd(keys.WORKERS, dead)
    redis_client.sadd(keys.worker_jobs(dead), job_id)
    tag = _fake_unacked(redis_client, job_id, VOID)
    lease = start_lease(leases, job_id, make_owner(dead, "p1"))
    assert isinstance(lease, Lease)
    assert job_id not in reaper.reap(redis_client, "reaper@h")  # still leased: it may be alive
    assert redis_client.sismember(keys.WORKERS, dead) and redis_client.hexists(keys.KOMBU_UNACKED, tag)
    redis_client.delete(keys.job_lease(job_id))  # the lease lapses

    def handed_back() -> bool:  # a live worker's reaper on this Redis may get there first
        reaper.reap(redis_client, "reaper@h")
        return not redis_client.hexists(keys.KOMBU_UNACKED, tag)

    wait_for(handed_back, 10, "the dead worker's job to be handed back")
    assert not redis_client.hexists(keys.KOMBU_UNACKED, tag) and not redis_client.sismember(
        keys.WORKERS, dead
    )
    assert job_id in _queued_ids(redis_client, VOID)
    redis_client.delete(VOID)


def test_restart_under_the_same_name_releases_the_previous_lifes_jobs(redis_client: redis.Redis) -> None:
    name, job_id = f"phoenix-{uuid.uuid4().hex[:6]}@h", f"job-{uuid.uuid4().hex[:8]}"
    leases = JobLeases(redis_client, ttl_s=30)
    redis_client.sadd(keys.worker_jobs(name), job_id)
    tag = _fake_unacked(redis_client, job_id, VOID)
    old = start_lease(leases, job_id, make_owner(name, "previous"))
    assert isinstance(old, Lease)
    assert reaper.release_own(redis_client, name, make_owner(name, "now")) == [job_id]
    assert leases.holder(job_id) is None and not redis_client.exists(keys.worker_jobs(name))
    assert not redis_client.hexists(keys.KOMBU_UNACKED, tag)
    assert job_id in _queued_ids(redis_client, VOID)
    new = start_lease(leases, job_id, make_owner(name, "now"))
    assert isinstance(new, Lease) and new.epoch == old.epoch + 1  # the old life stays fenced
    redis_client.delete(VOID, keys.worker_jobs(name))


class _FakeLoop:
    healthy = False
    failure = RuntimeError("boom")


class _FakeService:
    current_loop: Any = _FakeLoop()
    load_error: Exception | None = None


def test_supervisor_exits_after_the_loop_stays_unhealthy() -> None:
    exits: list[int] = []
    sup = Supervisor(_FakeService(), grace_s=5, exit_fn=exits.append)  # type: ignore[arg-type]
    assert not sup.check(now=100.0) and not sup.check(now=104.0)
    _FakeLoop.healthy = True
    assert not sup.check(now=104.5)  # recovered: the grace period starts over
    _FakeLoop.healthy = False
    assert not sup.check(now=105.0) and not sup.check(now=109.0)
    assert sup.check(now=110.5) and exits == [EXIT_CODE]


def test_supervisor_exits_when_the_engine_cannot_be_built() -> None:
    exits: list[int] = []
    service = _FakeService()
    service.current_loop = None
    service.load_error = OSError("weights unreadable")
    sup = Supervisor(service, grace_s=5, exit_fn=exits.append)  # type: ignore[arg-type]
    assert not sup.check(now=100.0) and sup.check(now=105.5) and exits == [EXIT_CODE]


def test_job_time_limit_is_enforced_and_frees_blocks(
    worker_factory: Callable[..., WorkerProcess],
    celery_app: Any,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KVFERRY_JOB_TIME_LIMIT_S", "2")
    # Not left to the engine's speed (the tiny model may well finish 900 tokens in time): the 40-token
    # prompt prefills a block a step (16 tokens), each step 1 s, so the job cannot end within its 2 s.
    monkeypatch.setenv("KVFERRY_MAX_NUM_BATCHED_TOKENS", "16")
    monkeypatch.setenv("KVFERRY_DEBUG_SLOW_STEP_S", "1")
    worker = worker_factory("timeboxed")
    job = GenerateJob(
        model=MODEL,
        prompt_token_ids=tuple(range(200, 240)),
        params=SamplingParams(max_tokens=900, ignore_eos=True),
    )
    handle = celery_app.send_task(
        keys.GENERATE_TASK, args=[encode_job(job)], task_id=str(uuid.uuid4()), queue=worker.queue
    )
    events = list(job_events.follow(redis_client, handle.id, timeout_s=30))
    final = events[-1]
    assert isinstance(final, JobFailed) and (final.error_type, final.status_code) == ("timeout", 504), final
    with pytest.raises(Exception, match="time limit"):
        handle.get(timeout=10)

    def freed() -> bool:
        status = next(w for w in live_workers(redis_client) if w.name == worker.name)
        return status.engine is not None and status.engine.pool_blocks_used == 0 and status.jobs_running == 0

    wait_for(freed, 10, "the timed-out job's blocks to be freed")


def test_orphan_sweep_hands_back_what_nobody_runs_and_drops_what_ended(redis_client: redis.Redis) -> None:
    """Unacked messages of no job set (a requeue lost with a broker connection, a shutdown cut
    short): back on their queue once past the grace; never while leased or young; a job that ended
    has its leftover message dropped."""
    orphan, leased, ended, young = (f"job-{uuid.uuid4().hex[:8]}" for _ in range(4))
    tags = {job: _fake_unacked(redis_client, job, VOID) for job in (orphan, leased, ended, young)}
    old = time.time() - 60
    redis_client.zadd(keys.KOMBU_UNACKED_INDEX, {tags[j]: old for j in (orphan, leased, ended)})
    assert isinstance(start_lease(JobLeases(redis_client, ttl_s=30), leased, make_owner("w@h", "p")), Lease)
    job_events.publish(redis_client, ended, JobFailed("invalid_request_error", "bad", 400))
    restored, _ = reaper.sweep_orphans(redis_client, grace_s=30)  # live workers' sweeps may race it
    assert leased not in restored and young not in restored
    assert _queued_ids(redis_client, VOID) == [orphan]  # back on its own queue (not a worker's)
    assert not redis_client.hexists(keys.KOMBU_UNACKED, tags[orphan])
    assert not redis_client.hexists(keys.KOMBU_UNACKED, tags[ended])
    for job in (leased, young):
        assert redis_client.hexists(keys.KOMBU_UNACKED, tags[job])
        redis_client.hdel(keys.KOMBU_UNACKED, tags[job])
        redis_client.zrem(keys.KOMBU_UNACKED_INDEX, tags[job])
    redis_client.delete(VOID, keys.job_lease(leased), keys.worker_jobs("w@h"))


def test_a_message_lost_between_pop_and_unacked_is_sent_again(
    redis_client: redis.Redis, celery_app: Any
) -> None:
    """kombu pops a message before it records it as unacked: a worker killed in between loses it.
    The api's copy (keys.job_message) sends it again once past the grace, under the same id;
    never while it waits on a queue, and not once a worker started it."""
    from workers.jobs import lost_messages

    lost, waiting, started = (f"job-{uuid.uuid4().hex[:8]}" for _ in range(3))
    job = encode_job(GenerateJob(MODEL, prompt_token_ids=(1, 2, 3)))
    old = time.time() - 60
    tag = _fake_unacked(redis_client, waiting, VOID)  # delivered to a live worker: present
    for job_id in (lost, waiting, started):
        redis_client.set(keys.job_message(job_id), json.dumps({"job": job, "queue": VOID}))
        redis_client.zadd(keys.PENDING_JOBS, {job_id: old})
        pipe = redis_client.pipeline()  # the api's record of where the message went
        record = delivery.Delivery(tag if job_id == waiting else uuid.uuid4().hex, VOID, old)
        delivery.record(pipe, job_id, record, 600)
        pipe.execute()
    redis_client.set(keys.job_epoch(started), 1)
    try:
        lost_messages.resend_lost(redis_client, celery_app, grace_s=30)  # live workers' passes may race it
        again = priority.queue_key(VOID, priority.band("interactive", 0))  # the job's own band
        assert set(_queued_ids(redis_client, again)) == {lost}  # same id: the lease lets one copy run
        assert not redis_client.exists(keys.job_message(started))
        assert redis_client.zscore(keys.PENDING_JOBS, started) is None
    finally:
        redis_client.hdel(keys.KOMBU_UNACKED, tag)
        redis_client.zrem(keys.KOMBU_UNACKED_INDEX, tag)
        redis_client.delete(*priority.queue_keys(VOID), keys.job_epoch(started))
        for job_id in (lost, waiting, started):
            lost_messages.forget_message(redis_client, job_id)
