"""Answering a completion request once its job is queued: wait for the job's final event (JSON),
or stream its tokens (SSE). A stream starts only after the job's first event, so a job that fails
at once (prompt too long, unknown model) is answered with a JSON error and its status code."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing

import anyio
from fastapi.responses import JSONResponse, Response, StreamingResponse
from redis import RedisError

from api.answer.choice_stream import ChoiceStream
from api.context import ApiContext
from api.errors import INTERNAL, UNAVAILABLE, error_response, failed_response
from api.jobs import tenant_jobs
from api.jobs.errors import ClientGoneError, JobTimeoutError
from api.jobs.meta import JobMeta
from api.jobs.outcome import is_final
from api.schema.answer import sse
from api.schema.answer.bodies import Choice, error_body, response_body
from api.schema.openai import CompletionRequest
from api.stage_clock import StageClock
from broker.errors import CodecError
from broker.messages import JobDone, JobFailed, StreamEvent, TokenDelta, Usage

log = logging.getLogger(__name__)
JOB_ID_HEADER = "X-Job-Id"
WORKER_HEADER = "X-Kvferry-Worker"  # which worker ran the job (non-stream; streams say it in the last chunk)
CLIENT_CLOSED = 499  # nginx's code: nobody reads it, the access log does


async def answer(
    ctx: ApiContext,
    meta: JobMeta,
    request: CompletionRequest,
    alive: Callable[[], Awaitable[bool]],
    clock: StageClock | None = None,
) -> Response:
    if request.stream:
        events = _observed(ctx, meta, request, ctx.jobs.follow(meta.job_id, ctx.config.job_timeout_s, alive))
        response = await _stream(ctx, meta, request, events)
    else:
        response = await _whole(ctx, meta, request, alive, clock)
    response.headers[JOB_ID_HEADER] = meta.job_id  # to poll GET /v1/jobs/{id} about it, even after an error
    if clock is not None:
        clock.mark("respond")
        response.headers.update(clock.header())
    return response


async def _observed(
    ctx: ApiContext, meta: JobMeta, request: CompletionRequest, events: AsyncGenerator[StreamEvent, None]
) -> AsyncGenerator[StreamEvent, None]:
    """The same events, timing the first token and the final event against submission."""
    label = "chat" if request.is_chat else "completion"
    first = True
    async with aclosing(events):
        async for event in events:
            if first and isinstance(event, TokenDelta):
                ctx.metrics.ttft.labels(label).observe(max(0.0, time.time() - meta.created))
                ctx.routing.prefilled(meta.job_id)
                first = False
            if is_final(event):
                await ended(ctx, meta, label, event)
            yield event


async def ended(ctx: ApiContext, meta: JobMeta, label: str, event: StreamEvent) -> None:
    """The job's end, seen as it came (a poll that finds a job ended long ago settles it without
    this: its end is no news to the router)."""
    ctx.routing.ended(meta.job_id)
    ctx.metrics.job_latency.labels(label).observe(max(0.0, time.time() - meta.created))
    result = event.result if isinstance(event, JobDone) else None
    await settle(ctx, meta, result.usage if result else None, result.queue_wait_s if result else None)


async def settle(
    ctx: ApiContext, meta: JobMeta, usage: Usage | None, queue_wait_s: float | None = None
) -> bool:
    """The job's end was seen: it stops counting against its tenant's cap and frees its seat in
    the dispatch window; its tokens and queue wait are counted once however many readers see the
    end. True for the first of them."""
    ctx.jobs.wake.set()  # this api's dispatcher (if it holds the lease) releases parked jobs now
    try:
        first = await tenant_jobs.finish(ctx.jobs.redis, meta.tenant, meta.job_id)
    except Exception as exc:  # the entries' deadlines still remove them
        log.warning("could not settle job %s: %s", meta.job_id, exc)
        return False
    if first and usage is not None:
        ctx.metrics.tokens(meta.tenant, usage)
    if first and queue_wait_s is not None:
        ctx.metrics.observe_queue_wait(meta.tenant, "interactive", queue_wait_s)
    return first


async def abandon(ctx: ApiContext, meta: JobMeta) -> None:
    """Nobody waits for the job any more: stop it rather than let it spend a worker's time."""
    try:
        await ctx.jobs.cancel(meta.job_id)
        await tenant_jobs.release(ctx.jobs.redis, meta.tenant, meta.job_id)
    except Exception as exc:  # the job's own TTLs and time limit still bound it
        log.warning("could not cancel job %s: %s", meta.job_id, exc)


def _timeout(ctx: ApiContext, meta: JobMeta) -> JSONResponse:
    message = f"job {meta.job_id} did not finish within {ctx.config.job_timeout_s:g}s; it was cancelled"
    return error_response(504, message, "server_error", code="timeout")


async def gave_up(ctx: ApiContext, meta: JobMeta, exc: JobTimeoutError | ClientGoneError) -> Response:
    """Nobody will read the answer (timed out, or the client left): cancel the job, say why."""
    await abandon(ctx, meta)
    return _timeout(ctx, meta) if isinstance(exc, JobTimeoutError) else Response(status_code=CLIENT_CLOSED)


async def _whole(
    ctx: ApiContext,
    meta: JobMeta,
    request: CompletionRequest,
    alive: Callable[[], Awaitable[bool]],
    clock: StageClock | None,
) -> Response:
    """Waits for the final event alone (one blocking read), never for the tokens before it: the
    result holds the whole answer."""
    try:
        event = await ctx.jobs.wait_final(meta.job_id, ctx.config.job_timeout_s, alive)
    except (JobTimeoutError, ClientGoneError) as exc:
        return await gave_up(ctx, meta, exc)
    if clock is not None:
        clock.mark("woken")
    label = "chat" if request.is_chat else "completion"
    if isinstance(event, JobDone):  # no token was followed: the worker's own first-token time
        ctx.metrics.ttft.labels(label).observe(max(0.0, event.result.ttft_s))
    await ended(ctx, meta, label, event)
    if isinstance(event, JobFailed):
        return failed_response(event)
    if isinstance(event, JobDone):
        r = event.result
        body = response_body(request, [Choice.of(r)], r.usage, meta.response_id)
        return JSONResponse(body, headers={WORKER_HEADER: r.worker})
    raise RuntimeError(f"job {meta.job_id}: its end stream holds a {type(event).__name__}")


async def _stream(
    ctx: ApiContext, meta: JobMeta, request: CompletionRequest, events: AsyncGenerator[StreamEvent, None]
) -> Response:
    try:
        first = await anext(events)  # a generator that raised is closed already
    except (JobTimeoutError, ClientGoneError) as exc:
        return await gave_up(ctx, meta, exc)
    if isinstance(first, JobFailed):
        await events.aclose()
        return failed_response(first)
    writer = sse.ChunkWriter(request, meta.response_id, int(meta.created))
    body = _sse(ctx, meta, request, writer, first, events)
    return StreamingResponse(body, media_type="text/event-stream", headers=sse.HEADERS)


async def _sse(
    ctx: ApiContext,
    meta: JobMeta,
    request: CompletionRequest,
    writer: sse.ChunkWriter,
    first: StreamEvent,
    events: AsyncGenerator[StreamEvent, None],
) -> AsyncIterator[bytes]:
    stream = ChoiceStream(request, writer)
    try:
        for chunk in stream.start():
            yield chunk
        event: StreamEvent | None = first
        while event is not None:
            for chunk in stream.chunks(event, request.include_usage):
                yield chunk
            if stream.finished:
                yield sse.DONE
                break
            event = await anext(events, None)
    except JobTimeoutError as exc:
        yield sse.error_frame(error_body(f"{exc}; it was cancelled", "server_error", code="timeout"))
        yield sse.DONE
    except ClientGoneError:
        pass
    except RedisError as exc:  # an error frame the client can read, not a connection cut mid-body
        log.warning("job %s: lost the queue service mid-stream: %s", meta.job_id, exc)
        yield sse.error_frame(error_body(UNAVAILABLE, "service_unavailable_error"))
        yield sse.DONE
    except CodecError as exc:  # our bug, not the queue's: a 500 frame, its cause in the log
        log.error("job %s: a stream event does not decode", meta.job_id, exc_info=exc)
        yield sse.error_frame(error_body(INTERNAL, "server_error"))
        yield sse.DONE
    finally:
        with anyio.CancelScope(shield=True):  # runs even when the response task is cancelled
            await events.aclose()
            if not stream.finished:
                await abandon(ctx, meta)
