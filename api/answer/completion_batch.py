"""A completion answered by several jobs: a /v1/completions body with several prompts, or n (and
best_of) choices of a prompt. A job per prompt and choice, queued together to one worker's queue
(api/routing/router.py, together: where routing sends the first, else the least loaded), so that a
prefix they share is computed once there (the scheduler admits a prompt whose next block another
is computing once that block is in the pool, and copies the partial last block a running choice
holds: workers/engine/block_manager.py). One response: a choice per prompt and choice,
prompt-major, as OpenAI's; streamed, the jobs' chunks interleave, each with its choice's index."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
from fastapi.responses import JSONResponse, Response, StreamingResponse

from api import intake
from api.answer.choice_stream import ChoiceStream
from api.answer.completion import JOB_ID_HEADER, WORKER_HEADER, abandon, ended, gave_up
from api.context import ApiContext
from api.errors import failed_response
from api.jobs.errors import ClientGoneError, JobTimeoutError
from api.jobs.meta import JobMeta
from api.routing.router import Route, choose_queue, together
from api.schema.answer import sse
from api.schema.answer.bodies import error_body, fanned_body
from api.schema.answer.usage import fan_in_usage
from api.schema.openai import CompletionRequest
from broker.messages import GenerateResult, JobDone, JobFailed, StreamEvent

Alive = Callable[[], Awaitable[bool]]


async def submit_all(
    ctx: ApiContext, groups: list[list[CompletionRequest]], tenant: str
) -> list[list[JobMeta]]:
    """Every job, or none: a refusal part way (the tenant's job cap) cancels those queued."""
    metas: list[list[JobMeta]] = []
    config = ctx.config
    route: Route | None = None
    try:
        if config.routing != "shared":  # every job of the request on one worker
            job = groups[0][0].to_job(tenant)
            first = await choose_queue(
                ctx.jobs.redis,
                job,
                config.routing,
                config.route_max_waiting,
                cache=ctx.jobs.fleet,
                memory=ctx.routing,
            )
            route = await together(
                ctx.jobs.redis, first, config.route_max_waiting, ctx.jobs.fleet, memory=ctx.routing
            )
        for group in groups:
            metas.append([await intake.submit(ctx, request, tenant, route=route) for request in group])
    except BaseException:
        with anyio.CancelScope(shield=True):
            for meta in (m for group in metas for m in group):
                await abandon(ctx, meta)
        raise
    return metas


async def answer_all(
    ctx: ApiContext, request: CompletionRequest, groups: list[list[JobMeta]], alive: Alive
) -> Response:
    metas = [m for group in groups for m in group]
    if request.stream:
        response = await _stream(ctx, request, groups, alive)
    else:
        response = await _whole(ctx, request, groups, metas, alive)
    response.headers[JOB_ID_HEADER] = ",".join(m.job_id for m in metas)
    return response


async def _finals(ctx: ApiContext, metas: list[JobMeta], alive: Alive) -> list[StreamEvent]:
    finals: list[StreamEvent | None] = [None] * len(metas)

    async def wait(i: int) -> None:
        finals[i] = await ctx.jobs.wait_final(metas[i].job_id, ctx.config.job_timeout_s, alive)

    try:
        async with anyio.create_task_group() as group:
            for i in range(len(metas)):
                group.start_soon(wait, i)
    except BaseExceptionGroup as group_exc:  # the first failure, as one job's wait raises it
        first: BaseException = group_exc
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None
    return [f for f in finals if f is not None]


async def _stopped(ctx: ApiContext, metas: list[JobMeta], exc: JobTimeoutError | ClientGoneError) -> Response:
    """Nobody will read the answers: every job is cancelled."""
    with anyio.CancelScope(shield=True):
        for meta in metas[1:]:
            await abandon(ctx, meta)
    return await gave_up(ctx, metas[0], exc)


async def _whole(
    ctx: ApiContext,
    request: CompletionRequest,
    groups: list[list[JobMeta]],
    metas: list[JobMeta],
    alive: Alive,
) -> Response:
    try:
        finals = await _finals(ctx, metas, alive)
    except (JobTimeoutError, ClientGoneError) as exc:
        return await _stopped(ctx, metas, exc)
    except BaseException:  # the queue service failed under a wait: no job runs on for nobody
        with anyio.CancelScope(shield=True):
            for meta in metas:
                await abandon(ctx, meta)
        raise
    for meta, event in zip(metas, finals, strict=True):
        await ended(ctx, meta, "completion", event)
    failed = next((e for e in finals if isinstance(e, JobFailed)), None)
    if failed is not None:
        return failed_response(failed)
    results = [e.result for e in finals if isinstance(e, JobDone)]
    body = fanned_body(request, [len(group) for group in groups], results, groups[0][0].response_id)
    workers = ",".join(dict.fromkeys(r.worker for r in results))
    return JSONResponse(body, headers={WORKER_HEADER: workers})


async def _stream(
    ctx: ApiContext, request: CompletionRequest, groups: list[list[JobMeta]], alive: Alive
) -> Response:
    metas = [m for group in groups for m in group]
    queue: asyncio.Queue[tuple[int, StreamEvent | BaseException]] = asyncio.Queue()

    async def follow(i: int) -> None:
        try:
            async for event in ctx.jobs.follow(metas[i].job_id, ctx.config.job_timeout_s, alive):
                await queue.put((i, event))
        except Exception as exc:
            await queue.put((i, exc))

    tasks = [asyncio.create_task(follow(i)) for i in range(len(metas))]
    body = _sse(ctx, request, metas, queue, tasks)
    return StreamingResponse(body, media_type="text/event-stream", headers=sse.HEADERS)


async def _sse(
    ctx: ApiContext,
    request: CompletionRequest,
    metas: list[JobMeta],
    queue: asyncio.Queue[tuple[int, StreamEvent | BaseException]],
    tasks: list[asyncio.Task[None]],
) -> AsyncIterator[bytes]:
    created = int(metas[0].created)
    streams = [
        ChoiceStream(request, sse.ChunkWriter(request, metas[0].response_id, created, index=i))
        for i in range(len(metas))
    ]
    results: list[GenerateResult | None] = [None] * len(metas)
    try:
        for stream in streams:
            for chunk in stream.start():
                yield chunk
        while not all(s.finished for s in streams):
            i, event = await queue.get()
            if isinstance(event, BaseException):
                streams[i].finished = True
                message = f"choice {i}: {type(event).__name__}: {event}"
                yield sse.error_frame(error_body(message, "server_error"))
                continue
            for chunk in streams[i].chunks(event, include_usage=False):
                yield chunk
            if isinstance(event, (JobDone, JobFailed)):
                await ended(ctx, metas[i], "completion", event)
                results[i] = event.result if isinstance(event, JobDone) else None
        done = [r for r in results if r is not None]
        if request.include_usage and len(done) == len(results):
            k = request.choices_per_prompt
            usages = [[r.usage for r in done[at : at + k]] for at in range(0, len(done), k)]
            yield streams[0].writer.usage(fan_in_usage(usages))
        yield sse.DONE
    finally:
        with anyio.CancelScope(shield=True):
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(BaseException):
                    await task
            for meta, stream in zip(metas, streams, strict=True):
                if not stream.finished:
                    await abandon(ctx, meta)
