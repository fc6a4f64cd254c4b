"""OpenAI's Responses API: create (JSON, stream, background), retrieve (or resume a background
response's stream after a sequence number), delete, cancel, and a response's input items. A
response belongs to its tenant: another tenant's id names nothing here (404)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from api import intake
from api.auth import Tenant
from api.context import Ctx
from api.errors import ApiError
from api.responses import record as records
from api.responses.body import ResponsesBody
from api.responses.create import create
from api.responses.record import ResponseRecord
from api.responses.settle import cancel, refresh
from api.responses.stream import stream_response
from api.schema.openapi_doc import body_of

router = APIRouter(prefix="/v1/responses")
MAX_PAGE = 100


async def _record(ctx: Ctx, response_id: str, tenant: str) -> ResponseRecord:
    record = await records.load(ctx.jobs.redis, tenant, response_id)
    if record is None:
        message = f"Response with id {response_id!r} not found."
        raise ApiError(404, message, "not_found_error", "response_id", "response_not_found")
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


def page(
    items: list[dict[str, Any]], after: str | None, limit: int, order: Literal["asc", "desc"]
) -> dict[str, Any]:
    """One page of a list, OpenAI's cursor pagination: the items after the one named `after`."""
    ordered = items if order == "asc" else items[::-1]
    if after is not None:
        at = next((i for i, item in enumerate(ordered) if item["id"] == after), None)
        if at is None:
            raise ApiError(400, f"no item {after!r} in this list", param="after")
        ordered = ordered[at + 1 :]
    data = ordered[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(ordered) > limit,
    }


@router.get("/{response_id}/input_items")
async def input_items(
    response_id: str,
    ctx: Ctx,
    tenant: Tenant,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 20,
    order: Literal["asc", "desc"] = "desc",
) -> dict[str, Any]:
    record = await _record(ctx, response_id, tenant)
    return page(record.input_items, after, limit, order)
