"""The OpenAI Batch API: create a batch over an uploaded JSONL file, read it, list them, cancel
it. The batch runner (api/batches/run/runner.py) does the work; these routes only read and write the
batch's record. A batch belongs to its tenant: another tenant's id names nothing here (404)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from api.auth import Tenant
from api.batches import records, state
from api.batches.quota import admit
from api.batches.records import BatchRecord
from api.context import Ctx
from api.errors import ApiError
from api.files import records as file_records
from api.files.expiry import ExpiresAfter
from api.ids import is_batch_id, is_file_id

router = APIRouter(prefix="/v1/batches")
ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
MAX_METADATA = 16  # OpenAI's limits: 16 pairs, keys up to 64 characters, values up to 512


class CreateBatch(BaseModel):
    model_config = ConfigDict(extra="allow")  # fields of later API versions: accepted, unused

    input_file_id: str = Field(min_length=1, max_length=200)
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None
    output_expires_after: ExpiresAfter | None = None  # its output and error files' (api/files/expiry.py)


def _not_found(batch_id: str) -> ApiError:
    return ApiError(
        404, f"No batch found with id '{batch_id}'.", "not_found_error", "batch_id", "batch_not_found"
    )


@router.post("")
async def create_batch(body: CreateBatch, ctx: Ctx, tenant: Tenant) -> dict[str, Any]:
    if body.endpoint not in ENDPOINTS:
        raise ApiError(
            400, f"endpoint must be one of {list(ENDPOINTS)}, got {body.endpoint!r}", param="endpoint"
        )
    if body.completion_window != "24h":
        message = f"completion_window must be '24h', got {body.completion_window!r}"
        raise ApiError(400, message, param="completion_window")
    metadata = body.metadata
    if metadata is not None and (
        len(metadata) > MAX_METADATA or any(len(k) > 64 or len(v) > 512 for k, v in metadata.items())
    ):
        raise ApiError(
            400, "metadata: at most 16 pairs, keys up to 64 and values up to 512 characters", param="metadata"
        )
    redis = ctx.jobs.redis
    input_id = body.input_file_id
    found = await file_records.get(redis, tenant, input_id) if is_file_id(input_id) else None
    if found is None:
        raise ApiError(404, f"No such File object: {body.input_file_id}", "not_found_error", "input_file_id")
    if found.purpose != "batch":
        message = (
            f"file {body.input_file_id} has purpose {found.purpose!r}; a batch's input needs purpose 'batch'"
        )
        raise ApiError(400, message, param="input_file_id")
    now = int(time.time())
    config = ctx.config
    chosen = body.output_expires_after
    rec = BatchRecord(
        id=records.new_batch_id(),
        tenant=tenant,
        endpoint=body.endpoint,
        input_file_id=body.input_file_id,
        created_at=now,
        expires_at=now + config.batch_expiry_s,
        metadata=metadata,
        retain_s=config.batch_retention_s,
        output_expires_s=chosen.seconds if chosen is not None else config.batch_output_expiry_s,
    )
    await admit(redis, tenant, rec.id, now, config.tenant_max_batches)
    await records.create(redis, rec)
    return rec.to_openai()


@router.get("/{batch_id}")
async def get_batch(batch_id: str, ctx: Ctx, tenant: Tenant) -> dict[str, Any]:
    rec = await records.get(ctx.jobs.redis, tenant, batch_id) if is_batch_id(batch_id) else None
    if rec is None:
        raise _not_found(batch_id)
    return rec.to_openai()


@router.get("")
async def list_batches(
    ctx: Ctx, tenant: Tenant, after: str | None = None, limit: int = Query(20, ge=1, le=100)
) -> dict[str, Any]:
    found, more = await records.list_batches(ctx.jobs.redis, tenant, after, limit)
    data = [r.to_openai() for r in found]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": more,
    }


@router.post("/{batch_id}/cancel")
async def cancel_batch(batch_id: str, ctx: Ctx, tenant: Tenant) -> dict[str, Any]:
    """The runner stops feeding it, cancels its running lines and writes what finished."""
    redis = ctx.jobs.redis
    rec = await records.get(redis, tenant, batch_id) if is_batch_id(batch_id) else None
    if rec is None:
        raise _not_found(batch_id)
    if not await state.cancel(redis, batch_id, int(time.time())):
        rec = await records.get(redis, tenant, batch_id)
        assert rec is not None
        if rec.status not in ("cancelling", "cancelled"):
            raise ApiError(409, f"Cannot cancel a batch with status '{rec.status}'.", param="batch_id")
    rec = await records.get(redis, tenant, batch_id)
    assert rec is not None
    return rec.to_openai()
