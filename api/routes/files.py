"""OpenAI's Files API: POST /v1/files (multipart, streamed into the file store under the limits of
api/files/upload.py and the tenant's quotas, api/files/quota.py; `expires_after` as
api/files/expiry.py reads it), GET /v1/files, GET /v1/files/{id}, GET /v1/files/{id}/content
(streamed), DELETE /v1/files/{id}. A file belongs to its tenant: another tenant's id is a 404,
whoever asks; so is an expired file."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any, BinaryIO, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from starlette.requests import ClientDisconnect

from api.auth import Tenant
from api.batches import records as batch_records
from api.context import Ctx
from api.errors import ApiError
from api.files import expiry, quota, records
from api.files.records import PURPOSES, FileRecord
from api.files.store import new_file_id
from api.files.upload import Upload, check_declared_size, receive
from api.ids import is_file_id

router = APIRouter(prefix="/v1/files")

_CHUNK = 64 * 1024


def _not_found(file_id: str) -> ApiError:
    return ApiError(404, f"No such File object: {file_id}", "invalid_request_error", "id")


async def _record(ctx: Ctx, tenant: str, file_id: str) -> FileRecord:
    rec = await records.get(ctx.jobs.redis, tenant, file_id) if is_file_id(file_id) else None
    if rec is None:
        raise _not_found(file_id)
    return rec


# The body is read by api/files/upload.py as it streams, so FastAPI cannot see the form: described here.
_FORM = {
    "type": "object",
    "required": ["file", "purpose"],
    "properties": {
        "file": {"type": "string", "format": "binary"},
        "purpose": {"type": "string", "enum": list(PURPOSES)},
        "expires_after[anchor]": {"type": "string", "enum": ["created_at"]},
        "expires_after[seconds]": {"type": "integer", "minimum": expiry.MIN_S, "maximum": expiry.MAX_S},
    },
}


@router.post(
    "",
    openapi_extra={"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": _FORM}}}},
)
async def create_file(request: Request, ctx: Ctx, tenant: Tenant) -> dict[str, Any]:
    config = ctx.config
    file_id = new_file_id()
    writer = None
    try:
        check_declared_size(request, config.files_max_bytes)
        await quota.precheck(ctx.jobs.redis, tenant, config)
        writer = await asyncio.to_thread(ctx.files.create, file_id)
        upload = await receive(request, writer, config.files_max_bytes, config.files_max_lines)
        rec = _record_of(file_id, tenant, upload, config.files_batch_expiry_s)
        await asyncio.to_thread(writer.commit)
    except BaseException as exc:
        if writer is not None:
            writer.abort()  # a refusal, a client gone or a cancel: no partial file stays
        if isinstance(exc, ClientDisconnect):  # nobody to answer; not a server error either
            raise ApiError(400, "the upload ended before its body did") from None
        if isinstance(exc, ApiError):
            # The rest of the body is never read, so this connection cannot carry another request:
            # closing it (not draining it, as a kept-alive one would be) stops the sender.
            exc.headers["connection"] = "close"
        raise
    try:
        await quota.save_upload(ctx.jobs.redis, rec, config)
    except BaseException:
        await asyncio.to_thread(ctx.files.delete, file_id)
        raise
    return rec.to_openai()


def _record_of(file_id: str, tenant: str, upload: Upload, batch_expiry_s: int) -> FileRecord:
    chosen = expiry.from_form(upload.fields)
    created_at = int(time.time())
    default_s = batch_expiry_s if upload.purpose == "batch" else 0
    return FileRecord(
        id=file_id,
        tenant=tenant,
        bytes=upload.bytes,
        created_at=created_at,
        filename=upload.filename,
        purpose=upload.purpose,
        lines=upload.lines,
        expires_at=expiry.expires_at(created_at, chosen, default_s),
    )


@router.get("")
async def list_files(
    ctx: Ctx,
    tenant: Tenant,
    purpose: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10000)] = 10000,
    after: str | None = None,
    order: Literal["asc", "desc"] = "desc",
) -> dict[str, Any]:
    found, has_more = await records.list_files(ctx.jobs.redis, tenant, purpose, after, limit, order)
    return {
        "object": "list",
        "data": [rec.to_openai() for rec in found],
        "first_id": found[0].id if found else None,
        "last_id": found[-1].id if found else None,
        "has_more": has_more,
    }


@router.get("/{file_id}")
async def retrieve_file(file_id: str, ctx: Ctx, tenant: Tenant) -> dict[str, Any]:
    return (await _record(ctx, tenant, file_id)).to_openai()


@router.get("/{file_id}/content")
async def file_content(file_id: str, ctx: Ctx, tenant: Tenant) -> StreamingResponse:
    rec = await _record(ctx, tenant, file_id)
    try:
        f = await asyncio.to_thread(ctx.files.open, file_id)
    except FileNotFoundError:
        raise _not_found(file_id) from None
    headers = {"content-length": str(rec.bytes), "content-disposition": f'attachment; filename="{file_id}"'}
    return StreamingResponse(_chunks(f), media_type="application/octet-stream", headers=headers)


def _in_use(file_id: str, batches: list[str]) -> ApiError:
    which = f" (batch {batches[0]})" if batches else ""
    message = (
        f"File {file_id} is the input of a batch that has not ended{which}: "
        "cancel the batch or wait for it to end first."
    )
    return ApiError(409, message, "invalid_request_error", "file_id", "file_in_use")


@router.delete("/{file_id}")
async def delete_file(file_id: str, ctx: Ctx, tenant: Tenant) -> dict[str, Any]:
    """Refused (409, file_in_use) while a batch not yet ended reads the file: docs/batches.md."""
    redis = ctx.jobs.redis
    await _record(ctx, tenant, file_id)
    if reading := await batch_records.readers(redis, file_id):
        raise _in_use(file_id, reading)
    try:
        if not await records.delete(redis, tenant, file_id):
            raise _not_found(file_id)
    except records.FileInUse:
        raise _in_use(file_id, []) from None
    await asyncio.to_thread(ctx.files.delete, file_id)
    return {"id": file_id, "object": "file", "deleted": True}


async def _chunks(f: BinaryIO) -> AsyncIterator[bytes]:
    try:
        while chunk := await asyncio.to_thread(f.read, _CHUNK):
            yield chunk
    finally:
        f.close()
