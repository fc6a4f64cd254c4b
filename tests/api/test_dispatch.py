"""Fair dispatch against a real redis-server: the submit script's admission (released or parked),
the release script's weighted fair order and fence, a parked job never resent by the lost-message
sweep until released, cancel, batch lines, free_slots and the dispatcher's lease."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any, TypeVar

import redis

from api.dispatch.capacity import free_slots
from api.dispatch.dispatcher import Dispatcher
from api.dispatch.lease import holder
from api.dispatch.release import ReleaseScript
from api.jobs import tenant_jobs
from api.jobs.admission import Admission
from api.jobs.client import JobClient
from api.jobs.meta import JobMeta
from broker import keys, priority
from broker.celery_app import BrokerConfig, make_celery
from broker.codec import encode_event
from broker.jobs.stream_append import FENCED_XADD, NO_FENCE, script_args, script_keys
from broker.messages import GenerateJob, GenerateResult, JobDone, Usage, WorkerStatus
from broker.worker_registry import HEARTBEAT_FIELD, encode_status
from tests.api.conftest import Served
from tests.api.fake_worker import FakeWorker
from workers.jobs.lost_messages import resend_lost

T = TypeVar("T")
MODEL = "smollm2"


def beat(rds: redis.Redis, name: str, concurrency: int, seats: int = 0) -> None:
    """A live worker's heartbeat saying its concurrency and seats (the windows)."""
    status = WorkerStatus(
        name, keys.worker_queue(name), MODEL, 0, 0, 0, time.time(), concurrency=concurrency, seats=seats
    )
    rds.hset(keys.worker_heartbeat(name), HEARTBEAT_FIELD, encode_status(status))
    rds.expire(keys.worker_heartbeat(name), 60)
    rds.sadd(keys.WORKERS, name)


def run(redis_url: str, body: Callable[[JobClient], Awaitable[T]], **admission: Any) -> T:
    """body(client) on a JobClient with fair dispatch (headroom 2, quota 1 unless given)."""
    terms = {"headroom": 2, "fair_quota": 1, "weight": lambda _t: 1.0, "timeout_s": 600.0, **admission}

    async def go() -> T:
        client = JobClient(BrokerConfig(redis_url=redis_url), job_ttl_s=600, admission=Admission(**terms))
        try:
            return await body(client)
        finally:
            await client.close()

    return asyncio.run(go())


async def submit(client: JobClient, tenant: str, job_class: str = "interactive", prio: int = 0) -> str:
    job_id = str(uuid.uuid4())
    job = GenerateJob(
        model=MODEL, prompt="hi", tenant=tenant, submitted_at=time.time(), job_class=job_class, priority=prio
    )  # type: ignore[arg-type]
    meta = JobMeta(job_id, "/v1/completions", MODEL, keys.SHARED_QUEUE, "test", time.time(), tenant)
    await client.submit(meta, job)
    return job_id


def queued_ids(rds: redis.Redis, band: int = 2) -> list[str]:
    """Job ids in the shared queue's band list, in push order (first pushed first)."""
    import json

    raw: Any = rds.lrange(priority.queue_key(keys.SHARED_QUEUE, band), 0, -1)
    return [json.loads(m)["headers"]["id"] for m in reversed(raw)]


def parked(rds: redis.Redis) -> set[str]:
    return {m.decode() for m in rds.zrange(keys.PARKED, 0, -1)}


def test_flood_parks_beyond_the_window_and_another_tenant_goes_straight(
    private: tuple[redis.Redis, str],
) -> None:
    rds, redis_url = private
    beat(rds, "w1@test", 6)  # window 6 - 2 = 4

    async def body(client: JobClient) -> tuple[list[str], str]:
        flood = [await submit(client, "alice") for _ in range(10)]
        return flood, await submit(client, "bob")

    flood, single = run(redis_url, body)
    assert queued_ids(rds) == [*flood[:4], single]  # bob under his quota: straight, ahead of alice's 6
    assert parked(rds) == set(flood[4:])
    assert rds.zcard(keys.INFLIGHT) == 5
    for job_id in flood[4:]:  # parked: no pending entry, no delivery record; metadata and copy kept
        assert rds.zscore(keys.PENDING_JOBS, job_id) is None
        assert not rds.exists(keys.job_delivery(job_id))
        assert rds.exists(keys.job_meta(job_id)) and rds.exists(keys.job_message(job_id))


def test_no_window_known_everything_straight(private: tuple[redis.Redis, str]) -> None:
    rds, redis_url = private
    beat(rds, "old@test", 0)  # an older worker: concurrency unknown

    async def body(client: JobClient) -> list[str]:
        return [await submit(client, "alice") for _ in range(8)]

    ids = run(redis_url, body)
    assert queued_ids(rds) == ids and not parked(rds)
    assert rds.zcard(keys.INFLIGHT) == 8


def test_lost_message_sweep_never_resends_a_parked_job(private: tuple[redis.Redis, str]) -> None:
    rds, redis_url = private
    beat(rds, "w1@test", 3)  # window 1

    async def body(client: JobClient) -> list[str]:
        return [await submit(client, "alice") for _ in range(3)]

    ids = run(redis_url, body)
    assert parked(rds) == set(ids[1:])
    app = make_celery(BrokerConfig(redis_url=redis_url), send_only=True)
    rds.delete(priority.queue_key(keys.SHARED_QUEUE, 2))  # even with the queue emptied (the first "lost")
    sent = resend_lost(rds, app, grace_s=0.0, now=time.time() + 3600)
    assert sent == [ids[0]]  # the released one only


def test_release_in_weighted_fair_order(private: tuple[redis.Redis, str]) -> None:
    rds, redis_url = private
    beat(rds, "w1@test", 6)  # window 4
    weights = {"alice": 2.0, "bob": 1.0}

    async def body(client: JobClient) -> tuple[list[str], list[str], Any]:
        fillers = [await submit(client, "carol") for _ in range(4)]
        a = [await submit(client, "alice") for _ in range(20)]
        b = [await submit(client, "bob") for _ in range(20)]
        assert parked(rds) == set(a) | set(b)
        rds.set(keys.DISPATCH_LEASE, "me|1")
        script = ReleaseScript(client.redis)
        wrong = await script.run("other|2", time.time(), 100, weights)
        assert wrong.fenced and wrong.released == 0
        for job_id in fillers:  # the window frees up: 30 seats
            await tenant_jobs.finish(client.redis, "carol", job_id)
        out = await script.run("me|1", time.time(), 30, weights)
        return a, b, out

    a, _, out = run(redis_url, body, fair_quota=0, weight=lambda t: weights.get(t, 1.0))
    assert (out.fenced, out.released, out.parked) == (False, 30, 10)
    order = queued_ids(rds)[4:]
    assert len(order) == 30
    from_a = [j for j in order if j in set(a)]
    assert 19 <= len(from_a) <= 21  # 2:1
    assert from_a == a[: len(from_a)]  # each tenant's own jobs in order
    for i in range(3, 31, 3):  # at every point of the order: close to 2:1
        share = sum(1 for j in order[:i] if j in set(a))
        assert abs(share - 2 * i / 3) <= 1.5, (i, share)
    assert all(rds.zscore(keys.PENDING_JOBS, j) is not None for j in order)  # now the sweep watches them
    assert rds.zcard(keys.INFLIGHT) == 30


def test_band_orders_a_tenants_parked_jobs(private: tuple[redis.Redis, str]) -> None:
    rds, redis_url = private
    beat(rds, "w1@test", 3)  # window 1

    async def body(client: JobClient) -> tuple[str, str]:
        await submit(client, "alice")
        late = await submit(client, "alice", prio=0)
        urgent = await submit(client, "alice", prio=-2)
        rds.set(keys.DISPATCH_LEASE, "me|1")
        await ReleaseScript(client.redis).run("me|1", time.time(), 100, {})
        return late, urgent

    late, urgent = run(redis_url, body)
    assert queued_ids(rds, band=0) == [urgent]
    assert rds.lindex(priority.queue_key(keys.SHARED_QUEUE, 2), 0) is not None
    assert late in queued_ids(rds, band=2)


def test_cancelled_parked_job_is_never_released(private: tuple[redis.Redis, str]) -> None:
    rds, redis_url = private
    beat(rds, "w1@test", 3)  # window 1

    async def body(client: JobClient) -> tuple[list[str], Any]:
        ids = [await submit(client, "alice") for _ in range(3)]
        await client.cancel(ids[1])
        assert parked(rds) == {ids[2]}
        await client.cancel(ids[0])  # a released one frees its seat at once
        assert rds.zcard(keys.INFLIGHT) == 0
        rds.set(keys.DISPATCH_LEASE, "me|1")
        return ids, await ReleaseScript(client.redis).run("me|1", time.time(), 1, {})

    ids, out = run(redis_url, body)
    assert out.released == 1 and out.parked == 0
    assert queued_ids(rds) == [ids[0], ids[2]]


def test_batch_lines_never_park_nor_count_against_the_tenant(private: tuple[redis.Redis, str]) -> None:
    rds, redis_url = private
    beat(rds, "w1@test", 3)  # window 1

    async def body(client: JobClient) -> list[str]:
        return [await submit(client, "alice", job_class="batch") for _ in range(3)]

    ids = run(redis_url, body)
    assert queued_ids(rds, band=7) == ids and not parked(rds)
    # the runner counts its own running lines (free_slots' batch_running), never INFLIGHT's
    assert rds.zcard(keys.INFLIGHT) == 0 and rds.zcard(keys.tenant_inflight("alice")) == 0


def test_worker_final_frees_the_seat(private: tuple[redis.Redis, str]) -> None:
    rds, redis_url = private

    async def body(client: JobClient) -> str:
        return await submit(client, "alice")

    job_id = run(redis_url, body)
    assert rds.zcard(keys.INFLIGHT) == 1 and rds.zcard(keys.tenant_inflight("alice")) == 1
    result = GenerateResult(job_id, MODEL, "x", (1,), "stop", Usage(1, 1, 0), "w", 0.1, 0.1, 0.1)
    FENCED_XADD(rds, script_keys(job_id, "alice"), script_args(NO_FENCE, 60, job_id, [JobDone(result)], None))
    assert encode_event(JobDone(result))  # (the event the api would read)
    assert rds.zcard(keys.INFLIGHT) == 0 and rds.zcard(keys.tenant_inflight("alice")) == 0


def test_free_slots(private: tuple[redis.Redis, str]) -> None:
    rds, redis_url = private

    async def body(client: JobClient) -> list[int]:
        ctx: Any = SimpleNamespace(jobs=client, config=SimpleNamespace(dispatch_headroom=2))
        seen = [await free_slots(ctx)]  # no worker: 0, batches wait for one
        beat(rds, "w1@test", 6)
        beat(rds, "w2@test", 4)  # window 4 + 2
        client.fleet.ttl_s = 0
        seen.append(await free_slots(ctx))
        for _ in range(7):
            await submit(client, "alice")  # 6 released (window 6, then quota), 1 parked
        seen.append(await free_slots(ctx))
        return seen

    assert run(redis_url, body, fair_quota=0) == [0, 6, 0]


def test_batch_window_fills_every_seat_and_interactive_keeps_its_own(
    private: tuple[redis.Redis, str],
) -> None:
    """Threads above seats: batch lines may fill the seats (concurrency - headroom), interactive
    jobs park beyond min(concurrency, seats) - headroom and never wait for batch lines."""
    rds, redis_url = private

    async def body(client: JobClient) -> tuple[int, int, list[str]]:
        ctx: Any = SimpleNamespace(jobs=client, config=SimpleNamespace(dispatch_headroom=2))
        beat(rds, "w1@test", 8, seats=6)
        client.fleet.ttl_s = 0
        empty = await free_slots(ctx)  # 8 - 2
        with_lines = await free_slots(ctx, batch_running=6)  # the runner's 6 running lines
        ids = [await submit(client, "alice") for _ in range(5)]  # window 6 - 2 = 4, quota 0
        return empty, with_lines, ids

    empty, with_lines, ids = run(redis_url, body, fair_quota=0)
    assert (empty, with_lines) == (6, 0)
    assert parked(rds) == {ids[4]}  # the interactive window, whatever batch lines run


def test_one_dispatcher_among_replicas_releases(private: tuple[redis.Redis, str]) -> None:
    rds, redis_url = private
    beat(rds, "w1@test", 3)  # window 1

    async def body(client: JobClient) -> tuple[list[str], str | None]:
        ids = [await submit(client, "alice") for _ in range(3)]
        one = Dispatcher(client, 2, dict, name="api-1")
        two = Dispatcher(client, 2, dict, name="api-2")
        first, second = await one.pass_once(), await two.pass_once()
        assert first is not None and first.released == 0 and second is None  # the window is full
        await tenant_jobs.finish(client.redis, "alice", ids[0])
        again = await one.pass_once()
        assert again is not None and again.released == 1 and again.parked == 1
        who = await holder(client.redis)
        await one.lease.release()
        taken = await two.pass_once()  # the other replica takes over at once
        assert taken is not None and two.lease.held
        await two.lease.release()
        return ids, who

    ids, who = run(redis_url, body)
    assert who == "api-1"
    assert queued_ids(rds) == ids[:2]


def test_metrics_show_queue_wait_parked_jobs_and_the_window(
    fresh_api: Served, rds: redis.Redis, worker: FakeWorker
) -> None:
    beat(rds, "w1@test", 6)  # window 6 - 4 (the default headroom) = 2
    time.sleep(1.1)  # past the api's fleet cache (read already by its dispatcher)
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 3}
    with fresh_api.client() as c:
        assert c.post("/v1/completions", json=body).status_code == 200
        worker.pause()
        for _ in range(6):  # 4 released (the default quota), 2 parked
            assert c.post("/v1/jobs", json={"endpoint": "/v1/completions", "body": body}).status_code == 202
        text = c.get("/metrics").text
    worker.resume()
    for line in (
        'kvferry_queue_wait_seconds_count{class="interactive",tenant=""} 1.0',
        'kvferry_jobs_parked{tenant=""} 2.0',
        "kvferry_dispatch_window 2.0",
        "kvferry_jobs_inflight 4.0",
    ):
        assert line in text, line
