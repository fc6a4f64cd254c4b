"""Queue-based jobs: POST /v1/jobs answers 202 at once; GET polls, DELETE cancels."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from api import intake
from api.auth import Tenant
from api.context import Ctx
from api.errors import ApiError
from api.job_meta import JobMeta
from api.job_view import FINAL_STATUSES, job_view
from api.openai_schema import ENDPOINTS

router = APIRouter(prefix="/v1/jobs")


async def _meta(ctx: Ctx, job_id: str, tenant: str) -> JobMeta:
    meta = await ctx.jobs.meta(job_id)
    if meta is None or meta.tenant != tenant:  # another tenant's job does not exist for you
        raise ApiError(404, f"no job {job_id!r}", "not_found_error", "job_id", "job_not_found")
    return meta


@router.post("", status_code=202)
async def submit_job(request: Request, ctx: Ctx, tenant: Tenant) -> JSONResponse:
    doc = await intake.read_json(request, ctx.config.max_body_bytes)
    if not isinstance(doc, dict):
        raise ApiError(400, 'expected {"endpoint": ..., "body": {...}}', param="body")
    endpoint = doc.get("endpoint")
    if endpoint not in ENDPOINTS:
        raise ApiError(400, f"'endpoint' must be one of {list(ENDPOINTS)}", param="endpoint")
    body = doc.get("body")
    parsed = intake.parse(
        endpoint, body, request.headers.get(intake.SESSION_HEADER), ctx.config.served_models
    )
    assert isinstance(body, dict)  # parse() accepted it
    meta = await intake.submit(
        ctx.jobs, parsed, body, tenant, ctx.config.routing, ctx.config.route_max_waiting
    )
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
    return await job_view(ctx.jobs, await _meta(ctx, job_id, tenant))


@router.delete("/{job_id}")
async def cancel_job(job_id: str, ctx: Ctx, tenant: Tenant) -> dict[str, Any]:
    meta = await _meta(ctx, job_id, tenant)
    view = await job_view(ctx.jobs, meta)
    if view["status"] in FINAL_STATUSES:
        return view
    await ctx.jobs.cancel(job_id)
    return await job_view(ctx.jobs, meta)
