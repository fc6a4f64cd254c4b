"""JobClient: the api's side of the broker. Sends jobs as Celery tasks, follows their event
streams in Redis (api/wait.py), cancels them and reads their state. Celery's client is
synchronous, so its calls (revoke, result state) run on a small thread pool of their own; Redis is
read and written with redis.asyncio, jobs included (a job's Celery message is pushed in the
transaction that records it)."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from celery import states

from api.jobs import submit_write, wait
from api.jobs.admission import Admission, released
from api.jobs.errors import UNAVAILABLE, BrokerUnavailableError
from api.jobs.leave import leave
from api.jobs.meta import JobMeta
from api.jobs.outcome import CeleryState
from api.routing.fleet import FleetCache
from api.stage_clock import StageClock
from broker import keys, priority
from broker.celery_app import BrokerConfig, make_celery
from broker.codec import decode_event, encode_job
from broker.jobs import delivery
from broker.jobs.events import EVENT_FIELD
from broker.jobs.lease import owner_worker
from broker.jobs.message_copy import forget
from broker.messages import GenerateJob, StreamEvent
from broker.redis import connect as redis_connect
from broker.task_message import check_supported, task_message

log = logging.getLogger(__name__)
T = TypeVar("T")
SYNC_TIMEOUT_S = 10.0  # the longest a request waits for a blocking Celery call


def _retrieve(call: asyncio.Future[Any]) -> None:
    if not call.cancelled():
        call.exception()


class JobClient:
    def __init__(
        self,
        broker: BrokerConfig,
        job_ttl_s: int,
        block_ms: int = 1000,
        state_poll_s: float = 2.0,
        accept_replicas: int = 0,
        accept_wait_ms: int = 500,
        on_unreplicated: Callable[[], object] | None = None,
        admission: Admission | None = None,
    ) -> None:
        self.job_ttl_s = job_ttl_s
        self.block_ms = block_ms
        self.state_poll_s = state_poll_s
        # socket_timeout must outlast the longest XREAD BLOCK; under Sentinel it follows a failover
        self.redis = redis_connect.connect_async(
            broker.redis_url, socket_connect_timeout=5, socket_timeout=block_ms / 1000 + 10
        )
        # Under Sentinel a 202 waits for this many replicas to hold the job (api/jobs/submit_write.py)
        self.accept_replicas = accept_replicas if redis_connect.is_sentinel(broker.redis_url) else 0
        self.accept_wait_ms = accept_wait_ms
        self.on_unreplicated = on_unreplicated  # a job accepted short of them (the replica was down)
        self.celery = make_celery(broker, name="kvferry-api", send_only=True)  # it follows streams
        check_supported(self.celery)  # its messages are pushed in our own transaction
        self._pool = ThreadPoolExecutor(8, thread_name_prefix="kvferry-api-celery")
        self.fleet = FleetCache()  # the router's view of the workers (api/routing/router.py)
        self.admission = admission  # None: every job is released at once (no fair dispatch)
        # set when this api parks a job or sees one end: its dispatcher (api/dispatch/) looks now
        self.wake = asyncio.Event()

    async def _sync(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking Celery call on the pool; past SYNC_TIMEOUT_S the request stops waiting."""
        call = asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args))
        call.add_done_callback(_retrieve)  # a call given up on may still fail: never an unread error
        try:
            # shield: a cancelled caller (a request gone, the api stopping) stops waiting at once,
            # where wait_for would wait for the thread, which a down broker holds for long
            async with asyncio.timeout(SYNC_TIMEOUT_S):
                return await asyncio.shield(call)
        except TimeoutError as exc:
            raise BrokerUnavailableError(f"the broker did not answer within {SYNC_TIMEOUT_S:g}s") from exc

    async def close(self) -> None:
        await self.redis.aclose()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.celery.close()

    async def submit(self, meta: JobMeta, job: GenerateJob, clock: StageClock | None = None) -> None:
        """Record the job and queue its Celery message in one Redis script: all land or none does
        (api/jobs/submit_write.py; under Sentinel, on a replica too before this returns)."""
        fields: dict[Any, Any] = meta.to_hash()
        encoded = encode_job(job)
        message = json.dumps({"job": encoded, "queue": meta.queue})
        try:
            band = priority.band(job.job_class, job.priority)
            queued = task_message(self.celery, keys.GENERATE_TASK, meta.job_id, [encoded], meta.queue, band)
            if clock is not None:
                clock.mark("meta")
            at = job.submitted_at or meta.created
            record = delivery.Delivery(queued.tag, queued.key, at)  # the band's list (FIFO within it)
            now = time.time()
            place = (
                await self.admission.placement(self.redis, self.fleet, job, now)
                if self.admission is not None
                else released(job, now + self.job_ttl_s)
            )
            write = submit_write.JobWrite(
                job_id=meta.job_id,
                fields=fields,
                message=message,
                queue_key=queued.key,
                payload=queued.payload,
                record=record,
                ttl_s=self.job_ttl_s,
                now=now,
                placement=place,
            )
            written = await submit_write.write_job(
                self.redis, write, self.accept_replicas, self.accept_wait_ms
            )
            acked = written.acked
            if written.parked:
                self.wake.set()
            if acked < self.accept_replicas:
                if self.on_unreplicated is not None:
                    self.on_unreplicated()
                log.warning(
                    "job %s accepted on the primary alone: %d of %d replicas",
                    meta.job_id,
                    acked,
                    self.accept_replicas,
                )
        except Exception as exc:
            if not isinstance(exc, UNAVAILABLE):
                raise  # a bug of ours (a CodecError, say): a 500, never "unavailable"
            raise BrokerUnavailableError(f"could not queue the job: {type(exc).__name__}: {exc}") from exc
        if clock is not None:
            clock.mark("published")

    async def meta(self, job_id: str) -> JobMeta | None:
        raw: Any = await self.redis.hgetall(keys.job_meta(job_id))
        return JobMeta.from_hash(job_id, raw) if raw else None

    async def cancel(self, job_id: str) -> None:
        """Flag the job (a running worker stops at its next token) and revoke it (a worker that
        has not started it yet drops it)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(keys.job_cancel(job_id), b"1", ex=self.job_ttl_s)
        forget(pipe, job_id)  # never sent again (nor its prompt kept)
        await pipe.execute()
        await leave(self.redis, job_id)  # never released if parked; its seat is free
        self.wake.set()
        await self._sync(self.celery.control.revoke, job_id)

    async def is_cancelled(self, job_id: str) -> bool:
        return bool(await self.redis.exists(keys.job_cancel(job_id)))

    async def celery_state(self, job_id: str) -> CeleryState:
        meta = await self._sync(functools.partial(self.celery.backend.get_task_meta, cache=False), job_id)
        return CeleryState(str(meta.get("status", states.PENDING)), meta.get("result"))

    async def lease_worker(self, job_id: str) -> str | None:
        """The worker that holds the job's lease (runs it) now, if any (broker/jobs/lease.py)."""
        owner: Any = await self.redis.hget(keys.job_lease(job_id), "owner")
        return owner_worker(owner.decode()) if owner else None

    async def last_event(self, job_id: str) -> tuple[int, StreamEvent | None]:
        """(events in the job's stream, the last of them)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.xlen(keys.job_stream(job_id))
        pipe.xrevrange(keys.job_stream(job_id), count=1)
        count, last = await pipe.execute()
        return int(count), decode_event(last[0][1][EVENT_FIELD]) if last else None

    def follow(
        self, job_id: str, timeout_s: float, alive: Callable[[], Awaitable[bool]] | None = None
    ) -> AsyncGenerator[StreamEvent, None]:
        """Every event of the job until its final one: api/wait.follow."""
        return wait.follow(self, job_id, timeout_s, alive)

    async def wait_final(
        self, job_id: str, timeout_s: float, alive: Callable[[], Awaitable[bool]] | None = None
    ) -> StreamEvent:
        """The job's final event, without its tokens: api/wait.wait_final."""
        return await wait.wait_final(self, job_id, timeout_s, alive)
