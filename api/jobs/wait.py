"""Waiting on a job: following its event stream until its final event, or waiting for that final
event alone (its end stream). A job that ended without writing one (revoked, its worker killed) is
read from Celery's state."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, Protocol

from celery import states
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from api.jobs.errors import BrokerUnavailableError, ClientGoneError, JobTimeoutError
from api.jobs.outcome import CeleryState, is_final, outcome_of
from broker import keys
from broker.codec import decode_event
from broker.jobs.events import EVENT_FIELD, TokenCursor
from broker.messages import StreamEvent

log = logging.getLogger(__name__)
REDIS_RETRY_S = 0.25  # while Redis restarts, a follower asks again this often (until its deadline)


class JobSource(Protocol):
    """What waiting on a job reads: api/jobs/client.JobClient."""

    redis: Any  # redis.asyncio.Redis
    block_ms: int  # the longest one XREAD blocks
    state_poll_s: float  # how often Celery is asked whether a silent job has ended

    async def celery_state(self, job_id: str) -> CeleryState: ...


async def follow(
    jobs: JobSource, job_id: str, timeout_s: float, alive: Callable[[], Awaitable[bool]] | None = None
) -> AsyncGenerator[StreamEvent, None]:
    """Every event of the job from the start until its final one (JobDone or JobFailed), each
    token index once and in order however often the job was redelivered (TokenCursor).
    Raises JobTimeoutError past timeout_s, ClientGoneError once `alive()` says so."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    next_poll = loop.time() + jobs.state_poll_s
    next_alive = loop.time() + jobs.block_ms / 1000
    stream, last = keys.job_stream(job_id), "0-0"
    cursor = TokenCursor()
    while True:
        reply = await _read(jobs, job_id, stream, last, deadline, timeout_s, count=256)
        for _, entries in reply:
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
            next_alive = now + jobs.block_ms / 1000
            if not await alive():
                raise ClientGoneError(job_id)
        if reply:
            next_poll = now + jobs.state_poll_s  # its worker is busy with it; no need to ask
        elif now >= next_poll:
            next_poll = now + jobs.state_poll_s
            outcome = await silent_outcome(jobs, job_id, stream, last)
            if outcome is not None:
                yield outcome
                return


async def wait_final(
    jobs: JobSource, job_id: str, timeout_s: float, alive: Callable[[], Awaitable[bool]] | None = None
) -> StreamEvent:
    """The job's final event (JobDone or JobFailed), without its tokens: one blocking read of
    its end stream (keys.job_end, written with the final event in the same script), however
    long the answer. Raises as follow() does."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    next_poll = loop.time() + jobs.state_poll_s
    end = keys.job_end(job_id)
    while True:
        reply = await _read(jobs, job_id, end, "0-0", deadline, timeout_s, count=1)
        for _, entries in reply:
            for _, fields in entries:
                return decode_event(fields[EVENT_FIELD])
        if alive is not None and not await alive():
            raise ClientGoneError(job_id)
        now = loop.time()
        if now >= next_poll:  # a job that ended without a final event (revoked, its worker killed)
            next_poll = now + jobs.state_poll_s
            outcome = await silent_outcome(jobs, job_id, end, "0-0")
            if outcome is not None:
                return outcome


async def _read(
    jobs: JobSource, job_id: str, stream: str, last: str, deadline: float, timeout_s: float, count: int
) -> list[Any]:
    """One blocking XREAD of `stream` after `last`, bounded by the deadline (JobTimeoutError past
    it); empty when nothing came or Redis failed: while it restarts the job goes on (AOF keeps its
    stream), so the caller keeps waiting."""
    remaining = deadline - asyncio.get_running_loop().time()
    if remaining <= 0:
        raise JobTimeoutError(f"job {job_id} did not finish within {timeout_s:g}s")
    block = max(1, int(min(jobs.block_ms / 1000, remaining) * 1000))  # BLOCK 0 is forever
    try:
        reply: Any = await jobs.redis.xread({stream: last}, block=block, count=count)
    except (RedisConnectionError, RedisTimeoutError) as exc:
        log.warning("job %s: reading %s failed (%s); retrying", job_id, stream, exc)
        await asyncio.sleep(REDIS_RETRY_S)
        return []
    return list(reply or [])


async def silent_outcome(jobs: JobSource, job_id: str, stream: str, last: str) -> StreamEvent | None:
    """The job's outcome if Celery says it ended and `stream` holds nothing more to read; None
    otherwise, or when Redis or the broker cannot say now (asked again at the next poll)."""
    try:
        state = await jobs.celery_state(job_id)
        if state.state not in states.READY_STATES:
            return None
        pending: Any = await jobs.redis.xread({stream: last}, count=1)
    except (RedisConnectionError, RedisTimeoutError, BrokerUnavailableError):
        return None
    return None if pending else outcome_of(job_id, state)
