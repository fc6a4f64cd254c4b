"""From an HTTP request to a queued job: read the JSON body within its size limit, parse it,
check the model, choose a queue, record the job's metadata and send it."""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any

from fastapi import Request

from api.errors import ApiError
from api.job_client import JobClient
from api.job_meta import JobMeta
from api.openai_schema import CompletionRequest, parse_request
from api.router import choose_queue
from broker.errors import InvalidRequestError, UnknownModelError

SESSION_HEADER = "x-session-id"
MAX_SESSION_ID_CHARS = 256


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
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}", param="body") from None


def parse(endpoint: str, body: Any, session_header: str | None, served: tuple[str, ...]) -> CompletionRequest:
    """A body's session_id wins over the X-Session-Id header."""
    request = parse_request(endpoint, body)
    if request.model not in served:
        raise UnknownModelError(f"The model `{request.model}` does not exist (served: {', '.join(served)})")
    if request.session_id is None and session_header:
        request = dataclasses.replace(request, session_id=session_header)
    if request.session_id is not None and len(request.session_id) > MAX_SESSION_ID_CHARS:
        raise InvalidRequestError(f"session_id is over {MAX_SESSION_ID_CHARS} characters", "session_id")
    return request


async def submit(
    jobs: JobClient,
    request: CompletionRequest,
    body: dict[str, Any],
    tenant: str,
    routing: str = "cache-aware",
    max_waiting: int = 8,
) -> JobMeta:
    job_id = str(uuid.uuid4())
    job = request.to_job(tenant)
    route = await choose_queue(jobs.redis, job, routing, max_waiting)
    queue, reason = route.queue, route.reason
    meta = JobMeta(
        job_id=job_id,
        endpoint=request.endpoint,
        model=request.model,
        queue=queue,
        reason=reason,
        created=job.submitted_at,
        body=body,
        tenant=tenant,
        session_id=request.session_id,
    )
    await jobs.submit(meta, job)
    return meta
