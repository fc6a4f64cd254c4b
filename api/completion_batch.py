"""A /v1/completions body with several prompts: one job per prompt, queued together (the router
sends prompts that share a prefix where it is held, and a worker computes a prefix that several
of them share once: the scheduler admits a prompt whose next block another one is computing
after that block is in the pool), answered as one response with a choice per prompt, in order."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
from fastapi.responses import JSONResponse, Response

from api import intake
from api.completion import JOB_ID_HEADER, WORKER_HEADER, abandon, ended, gave_up
from api.context import ApiContext
from api.errors import failed_response
from api.jobs.errors import ClientGoneError, JobTimeoutError
from api.jobs.meta import JobMeta
from api.schema.openai import Choice, CompletionRequest, response_body, total_usage
from broker.messages import JobDone, JobFailed, StreamEvent


async def submit_all(ctx: ApiContext, requests: list[CompletionRequest], tenant: str) -> list[JobMeta]:
    """Every prompt's job, or none: a refusal part way (the tenant's job cap) cancels the rest."""
    metas: list[JobMeta] = []
    try:
        for request in requests:
            metas.append(await intake.submit(ctx, request, tenant))
    except BaseException:
        with anyio.CancelScope(shield=True):
            for meta in metas:
                await abandon(ctx, meta)
        raise
    return metas


async def answer_all(
    ctx: ApiContext,
    metas: list[JobMeta],
    requests: list[CompletionRequest],
    alive: Callable[[], Awaitable[bool]],
) -> Response:
    finals: list[StreamEvent | None] = [None] * len(metas)

    async def wait(i: int) -> None:
        finals[i] = await ctx.jobs.wait_final(metas[i].job_id, ctx.config.job_timeout_s, alive)

    stopped: JobTimeoutError | ClientGoneError | None = None
    try:
        async with anyio.create_task_group() as group:
            for i in range(len(metas)):
                group.start_soon(wait, i)
    except* (JobTimeoutError, ClientGoneError) as group_exc:
        first = group_exc.exceptions[0]
        assert isinstance(first, (JobTimeoutError, ClientGoneError))
        stopped = first
    if stopped is not None:  # nobody will read the answers: every job is cancelled
        with anyio.CancelScope(shield=True):
            for meta in metas[1:]:
                await abandon(ctx, meta)
        return await gave_up(ctx, metas[0], stopped)
    label = "completion"
    for meta, event in zip(metas, finals, strict=True):
        assert event is not None
        await ended(ctx, meta, label, event)
    failed = next((e for e in finals if isinstance(e, JobFailed)), None)
    response: Response
    if failed is not None:
        response = failed_response(failed)
    else:
        results = [e.result for e in finals if isinstance(e, JobDone)]
        usage = total_usage([r.usage for r in results])
        body = response_body(requests[0], [Choice.of(r) for r in results], usage, metas[0].response_id)
        workers = ",".join(dict.fromkeys(r.worker for r in results))
        response = JSONResponse(body, headers={WORKER_HEADER: workers})
    response.headers[JOB_ID_HEADER] = ",".join(m.job_id for m in metas)
    return response
