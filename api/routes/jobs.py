"""Queue-based jobs: POST /v1/jobs answers 202 at once; GET polls, DELETE cancels."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from api import intake
from api.answer.completion import settle
from api.auth import Tenant
from api.context import Ctx
from api.errors import ApiError
from api.ids import is_job_id
from api.jobs import tenant_jobs
from api.jobs.meta import JobMeta
from api.jobs.view import FINAL_STATUSES, job_view
from api.schema.openai import ENDPOINTS
from api.schema.openapi_doc import body_of
from api.schema.requests import JobBody
from api.schema.validation import unsupported_parameter
from broker.messages import JobDone, Usage

router = APIRouter(prefix="/v1/jobs")


async def _meta(ctx: Ctx, job_id: str, tenant: str) -> JobMeta:
    meta = await ctx.jobs.meta(job_id) if is_job_id(job_id) else None
    if meta is None or meta.tenant != tenant:  # another tenant's job does not exist for you
        raise ApiError(404, f"no job {job_id!r}", "not_found_error", "job_id", "job_not_found")
    return meta


async def _view(ctx: Ctx, meta: JobMeta) -> dict[str, Any]:
    view = await job_view(ctx.jobs, meta)
    if view["status"] in FINAL_STATUSES:
        u = view.get("usage") or None
        usage = (
            None
            if u is None
            else Usage(
                u["prompt_tokens"], u["completion_tokens"], u["prompt_tokens_details"]["cached_tokens"]
            )
        )
        if await settle(ctx, meta, usage) and view["status"] == "succeeded":
            await _observe_wait(ctx, meta)
    return view


async def _observe_wait(ctx: Ctx, meta: JobMeta) -> None:
    """The job's queue wait, from its final event (read once per job: the first to settle it)."""
    _, last = await ctx.jobs.last_event(meta.job_id)
    if isinstance(last, JobDone):
        ctx.metrics.observe_queue_wait(meta.tenant, "interactive", last.result.queue_wait_s)


@router.post("", status_code=202, openapi_extra=body_of(JobBody))
async def submit_job(request: Request, ctx: Ctx, tenant: Tenant) -> JSONResponse:
    doc = await intake.read_json(request, ctx.config.max_body_bytes)
    if not isinstance(doc, dict):
        raise ApiError(400, 'expected {"endpoint": ..., "body": {...}}', param="body")
    unknown = sorted(doc.keys() - JobBody.model_fields.keys())
    if unknown:
        raise unsupported_parameter(unknown[0])
    endpoint = doc.get("endpoint")
    if endpoint not in ENDPOINTS:
        raise ApiError(400, f"'endpoint' must be one of {list(ENDPOINTS)}", param="endpoint")
    parsed = intake.parse(ctx, endpoint, doc.get("body"), request.headers.get(intake.SESSION_HEADER))
    if parsed.fans_out:
        message = "a job holds one prompt and one choice: submit a job per prompt and choice"
        raise ApiError(400, message, param="body.n" if parsed.choices_per_prompt > 1 else "body.prompt")
    meta = await intake.submit(ctx, parsed, tenant)
    job = {
        "id": meta.job_id,
        "object": "job",
        "status": "queued",
        "endpoint": meta.endpoint,
        "model": meta.model,
        "queue": meta.queue,
        "route": {"queue": meta.queue, "reason": meta.reason},
        "created": int(meta.created),
    }
    return JSONResponse(job, status_code=202)


@router.get("/{job_id}")
async def get_job(job_id: str, ctx: Ctx, tenant: Tenant) -> dict[str, Any]:
    return await _view(ctx, await _meta(ctx, job_id, tenant))


@router.delete("/{job_id}")
async def cancel_job(job_id: str, ctx: Ctx, tenant: Tenant) -> dict[str, Any]:
    meta = await _meta(ctx, job_id, tenant)
    view = await _view(ctx, meta)
    if view["status"] in FINAL_STATUSES:
        return view
    await ctx.jobs.cancel(job_id)
    await tenant_jobs.release(ctx.jobs.redis, tenant, job_id)
    return await job_view(ctx.jobs, meta)
