"""JobClient: the api's side of the broker. Sends jobs as Celery tasks, follows their event
streams in Redis, cancels them and reads their state. Celery's client is synchronous, so its calls
run on a small thread pool of their own; Redis is read with redis.asyncio."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import redis.asyncio as aioredis
from celery import states
from kombu.exceptions import OperationalError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from api.job_meta import JobMeta
from api.stage_clock import StageClock
from broker import keys
from broker.celery_app import BrokerConfig, make_celery
from broker.codec import CodecError, decode_event, decode_result, encode_job
from broker.errors import KvferryError
from broker.job_events import EVENT_FIELD, TokenCursor
from broker.messages import GenerateJob, GenerateResult, JobDone, JobFailed, StreamEvent, Usage

T = TypeVar("T")
log = logging.getLogger(__name__)
REDIS_RETRY_S = 0.25  # while Redis restarts, a follower asks again this often (until its deadline)
SYNC_TIMEOUT_S = 10.0  # the longest a request waits for a blocking Celery call
# kombu's publish retries: a broker that is down fails the request in about a second, not minutes.
SEND_RETRY_POLICY = {"max_retries": 2, "interval_start": 0.0, "interval_step": 0.25, "interval_max": 0.5}


class BrokerUnavailableError(KvferryError):
    """The job could not be queued (HTTP 503); nothing about it was kept."""


class JobTimeoutError(KvferryError, TimeoutError):
    """The job produced no final event in time (HTTP 504)."""


class ClientGoneError(KvferryError):
    """The HTTP client went away while its job ran."""


# What a queue service that is down (or restarting) raises here: Redis', kombu's and the socket's
# errors. Anything else (a CodecError, say) is a bug of ours: a 500, never "unavailable".
UNAVAILABLE: tuple[type[Exception], ...] = (
    aioredis.RedisError,
    OperationalError,
    OSError,
    BrokerUnavailableError,
)


@dataclass(frozen=True, slots=True)
class CeleryState:
    state: str  # celery.states: PENDING, STARTED, SUCCESS, FAILURE, REVOKED, RETRY
    result: Any  # SUCCESS: the encoded GenerateResult; FAILURE: the exception; STARTED: {"hostname"}

    @property
    def hostname(self) -> str | None:
        host = self.result.get("hostname") if isinstance(self.result, dict) else None
        return host if isinstance(host, str) else None


def is_final(event: StreamEvent | None) -> bool:
    return isinstance(event, (JobDone, JobFailed))


def outcome_of(job_id: str, state: CeleryState) -> StreamEvent | None:
    """The final event a job that ended without writing one (revoked before it ran, killed, its
    stream expired) stands for; None while the job is not over."""
    if state.state == states.SUCCESS:
        try:
            return JobDone(decode_result(state.result))
        except CodecError as exc:  # a bug or a version mismatch, not the client's: log its cause
            log.error("job %s: its result does not decode", job_id, exc_info=exc)
            return JobFailed("server_error", f"unreadable job result: {exc}", 500)
    if state.state == states.FAILURE:
        return JobFailed("server_error", f"the job failed on its worker: {state.result!s}", 500)
    if state.state == states.REVOKED:
        nothing = Usage(0, 0, 0)
        return JobDone(GenerateResult(job_id, "", "", (), "abort", nothing, "", 0.0, 0.0, 0.0))
    return None


class JobClient:
    def __init__(
        self, broker: BrokerConfig, job_ttl_s: int, block_ms: int = 1000, state_poll_s: float = 2.0
    ) -> None:
        self.job_ttl_s = job_ttl_s
        self.block_ms = block_ms
        self.state_poll_s = state_poll_s
        # socket_timeout must outlast the longest XREAD BLOCK
        self.redis = aioredis.Redis.from_url(
            broker.redis_url, socket_connect_timeout=5, socket_timeout=block_ms / 1000 + 10
        )
        self.celery = make_celery(broker, name="kvferry-api")
        self._pool = ThreadPoolExecutor(8, thread_name_prefix="kvferry-api-celery")

    async def _sync(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking Celery call on the pool; past SYNC_TIMEOUT_S the request stops waiting."""
        call = asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args))
        try:
            return await asyncio.wait_for(call, SYNC_TIMEOUT_S)
        except TimeoutError as exc:
            raise BrokerUnavailableError(f"the broker did not answer within {SYNC_TIMEOUT_S:g}s") from exc

    async def close(self) -> None:
        await self.redis.aclose()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.celery.close()

    async def submit(self, meta: JobMeta, job: GenerateJob, clock: StageClock | None = None) -> None:
        """Record the job's metadata, then queue it; if queueing fails, the metadata goes too."""
        key = keys.job_meta(meta.job_id)
        fields: dict[Any, Any] = meta.to_hash()
        message = json.dumps({"job": encode_job(job), "queue": meta.queue})
        try:
            pipe = self.redis.pipeline(transaction=True)
            pipe.hset(key, mapping=fields)
            pipe.expire(key, self.job_ttl_s)
            # until a worker starts it (then the worker deletes both): see workers/lost_jobs.py
            pipe.set(keys.job_message(meta.job_id), message, ex=self.job_ttl_s)
            pipe.zadd(keys.PENDING_JOBS, {meta.job_id: time.time()})
            await pipe.execute()
            if clock is not None:
                clock.mark("meta")
            await self.send(meta.job_id, job, meta.queue)
            if clock is not None:
                clock.mark("published")
        except Exception as exc:
            with contextlib.suppress(aioredis.RedisError):  # else its TTL removes it
                await self.redis.delete(key, keys.job_message(meta.job_id))
                await self.redis.zrem(keys.PENDING_JOBS, meta.job_id)
            if not isinstance(exc, UNAVAILABLE):
                raise
            raise BrokerUnavailableError(f"could not queue the job: {type(exc).__name__}: {exc}") from exc

    async def send(self, job_id: str, job: GenerateJob, queue: str) -> None:
        await self._sync(self._send, job_id, job, queue)

    def _send(self, job_id: str, job: GenerateJob, queue: str) -> None:
        self.celery.send_task(
            keys.GENERATE_TASK,
            args=[encode_job(job)],
            task_id=job_id,
            queue=queue,
            retry=True,
            retry_policy=SEND_RETRY_POLICY,
        )

    async def meta(self, job_id: str) -> JobMeta | None:
        raw: Any = await self.redis.hgetall(keys.job_meta(job_id))
        return JobMeta.from_hash(job_id, raw) if raw else None

    async def cancel(self, job_id: str) -> None:
        """Flag the job (a running worker stops at its next token) and revoke it (a worker that
        has not started it yet drops it)."""
        await self.redis.set(keys.job_cancel(job_id), b"1", ex=self.job_ttl_s)
        await self.redis.delete(keys.job_message(job_id))  # never sent again (nor its prompt kept)
        await self.redis.zrem(keys.PENDING_JOBS, job_id)
        await self._sync(self.celery.control.revoke, job_id)

    async def is_cancelled(self, job_id: str) -> bool:
        return bool(await self.redis.exists(keys.job_cancel(job_id)))

    async def celery_state(self, job_id: str) -> CeleryState:
        meta = await self._sync(functools.partial(self.celery.backend.get_task_meta, cache=False), job_id)
        return CeleryState(str(meta.get("status", states.PENDING)), meta.get("result"))

    async def last_event(self, job_id: str) -> tuple[int, StreamEvent | None]:
        """(events in the job's stream, the last of them)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.xlen(keys.job_stream(job_id))
        pipe.xrevrange(keys.job_stream(job_id), count=1)
        count, last = await pipe.execute()
        return int(count), decode_event(last[0][1][EVENT_FIELD]) if last else None

    async def follow(
        self, job_id: str, timeout_s: float, alive: Callable[[], Awaitable[bool]] | None = None
    ) -> AsyncGenerator[StreamEvent, None]:
        """Every event of the job from the start until its final one (JobDone or JobFailed), each
        token index once and in order however often the job was redelivered (TokenCursor).
        Raises JobTimeoutError past timeout_s, ClientGoneError once `alive()` says so."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        next_poll = loop.time() + self.state_poll_s
        next_alive = loop.time() + self.block_ms / 1000
        stream, last = keys.job_stream(job_id), "0-0"
        cursor = TokenCursor()
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise JobTimeoutError(f"job {job_id} did not finish within {timeout_s:g}s")
            block = max(1, int(min(self.block_ms / 1000, remaining) * 1000))  # BLOCK 0 is forever
            try:
                reply: Any = await self.redis.xread({stream: last}, block=block, count=256)
            except (RedisConnectionError, RedisTimeoutError) as exc:
                # Redis restarting: the job goes on (AOF keeps its stream); keep following it.
                log.warning("job %s: stream read failed (%s); retrying", job_id, exc)
                await asyncio.sleep(REDIS_RETRY_S)
                continue
            for _, entries in reply or []:
                for entry_id, fields in entries:
                    last = entry_id
                    event = cursor.accept(decode_event(fields[EVENT_FIELD]))
                    if event is None:
                        continue  # tokens an earlier attempt already streamed
                    yield event
                    if is_final(event):
                        return
            now = loop.time()
            # checked while tokens flow too: a client that left should not keep its job running
            if alive is not None and now >= next_alive:
                next_alive = now + self.block_ms / 1000
                if not await alive():
                    raise ClientGoneError(job_id)
            if reply:
                next_poll = now + self.state_poll_s  # its worker is busy with it; no need to ask
            elif now >= next_poll:
                next_poll = now + self.state_poll_s
                try:
                    settled = await self._settled_silently(job_id, stream, last)
                except (RedisConnectionError, RedisTimeoutError, BrokerUnavailableError):
                    settled = None  # asked again at the next poll
                if settled is not None:
                    yield settled
                    return

    async def wait_final(
        self, job_id: str, timeout_s: float, alive: Callable[[], Awaitable[bool]] | None = None
    ) -> StreamEvent:
        """The job's final event (JobDone or JobFailed), without its tokens: one blocking read of
        its end stream (keys.job_end, written with the final event in the same script), however
        long the answer. Raises as follow() does."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        next_poll = loop.time() + self.state_poll_s
        end = keys.job_end(job_id)
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise JobTimeoutError(f"job {job_id} did not finish within {timeout_s:g}s")
            block = max(1, int(min(self.block_ms / 1000, remaining) * 1000))  # BLOCK 0 is forever
            try:
                reply: Any = await self.redis.xread({end: "0-0"}, block=block, count=1)
            except (RedisConnectionError, RedisTimeoutError) as exc:
                log.warning("job %s: end stream read failed (%s); retrying", job_id, exc)
                await asyncio.sleep(REDIS_RETRY_S)
                continue
            for _, entries in reply or []:
                for _, fields in entries:
                    return decode_event(fields[EVENT_FIELD])
            if alive is not None and not await alive():
                raise ClientGoneError(job_id)
            now = loop.time()
            if now >= next_poll:  # a job that ended without a final event (revoked, its worker killed)
                next_poll = now + self.state_poll_s
                try:
                    settled = await self._settled_silently(job_id, end, "0-0")
                except (RedisConnectionError, RedisTimeoutError, BrokerUnavailableError):
                    settled = None  # asked again at the next poll
                if settled is not None:
                    return settled

    async def _settled_silently(self, job_id: str, stream: str, last: str) -> StreamEvent | None:
        """The job's outcome if Celery says it ended and `stream` holds nothing more to read."""
        state = await self.celery_state(job_id)
        if state.state not in states.READY_STATES:
            return None
        pending: Any = await self.redis.xread({stream: last}, count=1)
        return None if pending else outcome_of(job_id, state)
