"""OpenAI's Responses API: create (JSON, stream, background), retrieve (or resume a background
response's stream after a sequence number), delete, cancel, and a response's input items. A
response belongs to its tenant: another tenant's id names nothing here (404)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from api import intake
from api.auth import Tenant
from api.context import Ctx
from api.errors import ApiError
from api.responses import record as records
from api.responses.body import ResponsesBody
from api.responses.create import create
from api.responses.listing import Paging, not_found, page
from api.responses.record import ResponseRecord
from api.responses.settle import cancel, refresh
from api.responses.stream import stream_response
from api.schema.openapi_doc import body_of

router = APIRouter(prefix="/v1/responses")


async def _record(ctx: Ctx, response_id: str, tenant: str) -> ResponseRecord:
    record = await records.load(ctx.jobs.redis, tenant, response_id)
    if record is None:
        raise not_found("Response", response_id)
    return record


@router.post("", openapi_extra=body_of(ResponsesBody))
async def create_response(request: Request, ctx: Ctx, tenant: Tenant) -> Response:
    raw = await intake.read_json(request, ctx.config.max_body_bytes)

    async def alive() -> bool:
        return not await request.is_disconnected()

    return await create(ctx, raw, tenant, alive)


@router.get("/{response_id}")
async def get_response(
    response_id: str,
    ctx: Ctx,
    tenant: Tenant,
    stream: bool = False,
    starting_after: Annotated[int, Query(ge=-1)] = -1,
) -> Response:
    record = await _record(ctx, response_id, tenant)
    if stream:
        if not record.body.get("background"):
            raise ApiError(400, "only a background response's stream can be resumed", param="stream")
        return await stream_response(ctx, record, None, starting_after, owns_job=False)
    return JSONResponse((await refresh(ctx, record)).body)


@router.delete("/{response_id}")
async def delete_response(response_id: str, ctx: Ctx, tenant: Tenant) -> dict[str, Any]:
    await _record(ctx, response_id, tenant)
    await records.delete(ctx.jobs.redis, tenant, response_id)
    return {"id": response_id, "object": "response", "deleted": True}


@router.post("/{response_id}/cancel")
async def cancel_response(response_id: str, ctx: Ctx, tenant: Tenant) -> dict[str, Any]:
    record = await _record(ctx, response_id, tenant)
    if not record.body.get("background"):
        raise ApiError(400, "only a background response can be cancelled", param="response_id")
    return (await cancel(ctx, await refresh(ctx, record))).body


@router.get("/{response_id}/input_items")
async def input_items(response_id: str, ctx: Ctx, tenant: Tenant, paging: Paging) -> dict[str, Any]:
    record = await _record(ctx, response_id, tenant)
    return page(record.input_items, paging)
