"""From an HTTP request to a queued job: read the JSON body within its size and depth limits,
validate it, check the model, admit it under its tenant's job cap (a batch line has none), choose
a queue, record the job's metadata and send it (or park it: api/jobs/submit_write.py). Nothing is
written to Redis before a request is known to be valid."""

from __future__ import annotations

import dataclasses
import re
import time
import uuid
from typing import Any

import msgspec
from fastapi import Request

from api.context import ApiContext
from api.errors import ApiError
from api.jobs import tenant_jobs
from api.jobs.meta import JobMeta
from api.routing.router import Route, choose_queue
from api.schema import json_guard
from api.schema.openai import CompletionRequest, parse_request
from api.schema.requests import ID_PATTERN
from api.stage_clock import StageClock
from broker.errors import InvalidRequestError, UnknownModelError

SESSION_HEADER = "x-session-id"
RETRY_AFTER_S = 1  # a tenant at its job cap: a job of a few seconds will have finished by then
_ID = re.compile(ID_PATTERN)


async def read_json(request: Request, max_bytes: int) -> Any:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise ApiError(413, f"request body over {max_bytes} bytes", param="body")
    chunks, size = [], 0
    async for chunk in request.stream():  # a chunked body has no content-length to trust
        size += len(chunk)
        if size > max_bytes:
            raise ApiError(413, f"request body over {max_bytes} bytes", param="body")
        chunks.append(chunk)
    return json_guard.loads(b"".join(chunks))


def parse(ctx: ApiContext, endpoint: str, body: Any, session_header: str | None) -> CompletionRequest:
    """A body's session_id wins over the X-Session-Id header (held to the same charset)."""
    request = parse_request(endpoint, body, ctx.config.default_max_tokens, ctx.config.tool_call_parser)
    served = ctx.config.served_models
    if request.model not in served:
        raise UnknownModelError(f"The model `{request.model}` does not exist (served: {', '.join(served)})")
    if request.session_id is None and session_header:
        if not _ID.match(session_header):
            raise InvalidRequestError(f"the X-Session-Id header must match {ID_PATTERN}", "session_id")
        request = dataclasses.replace(request, session_id=session_header)
    if request.session_id is not None and request.fans_out:
        raise InvalidRequestError("a session continues one conversation: n = 1 and one prompt", "n")
    return request


async def submit(
    ctx: ApiContext,
    request: CompletionRequest,
    tenant: str,
    clock: StageClock | None = None,
    route: Route | None = None,
) -> JobMeta:
    """route: a sibling's (the choices of one prompt run where its blocks are), else chosen here."""
    jobs, config = ctx.jobs, ctx.config
    job_id = str(uuid.uuid4())
    job = request.to_job(tenant)
    deadline = job.submitted_at + config.job_timeout_s
    capped = job.job_class != "batch"  # a batch's lines are fed by its runner, not capped
    if capped and not await tenant_jobs.admit(jobs.redis, tenant, job_id, deadline, config.tenant_max_jobs):
        ctx.metrics.tenant_rejected.labels(tenant).inc()
        raise ApiError(
            429,
            f"too many unfinished jobs: at most {config.tenant_max_jobs} at once per tenant",
            "rate_limit_error",
            code="tenant_job_limit",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    try:
        route = route or await choose_queue(
            jobs.redis,
            job,
            config.routing,
            config.route_max_waiting,
            prefetch_hints=config.prefetch_hints,
            cache=jobs.fleet,
            move_after=config.session_move_after_turns,
            redis_tier=config.redis_tier,
            job_id=job_id,
            memory=ctx.routing,
            move_every=config.session_move_every_turns,
        )
        if route.prefetch_to:  # turn K of a forced move: its worker hints turn K+1's (api/routing/hints.py)
            job = msgspec.structs.replace(job, prefetch_to=route.prefetch_to)
        if clock is not None:
            clock.mark("routed")
        meta = JobMeta.of(job_id, request, route.queue, route.reason, job.submitted_at or time.time(), tenant)
        await jobs.submit(meta, job, clock)
    except Exception:
        if capped:
            await tenant_jobs.release(jobs.redis, tenant, job_id)
        raise
    return meta
