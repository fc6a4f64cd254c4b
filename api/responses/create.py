"""POST /v1/responses: the body checked, its conversation so far found (a previous response's, or
a conversation's), its chat job queued on the session that conversation runs on, its record kept
(unless store is false); then the answer as JSON, as a stream of events, or (background) at once
as `queued` with a watcher that records its end."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse, Response

from api import intake
from api.answer.completion import gave_up
from api.context import ApiContext
from api.errors import failed_response
from api.jobs.errors import ClientGoneError, JobTimeoutError
from api.responses import chain, conversations, render
from api.responses import record as records
from api.responses.body import KNOWN_ITEMS, ResponsesBody
from api.responses.build import chat_body
from api.responses.items import ChatDict, chat_messages, input_item_bodies
from api.responses.record import ResponseRecord
from api.responses.settle import finish, refresh
from api.responses.stream import stream_response
from api.schema.validation import unsupported_parameter, validate
from broker.errors import InvalidRequestError
from broker.messages import JobFailed
from broker.sessions import cache_key

log = logging.getLogger(__name__)
_watchers: set[asyncio.Task[None]] = set()  # background responses' watchers (held: never collected)


def _not_found(what: str, ident: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(f"{what} with id {ident!r} not found.", param)


@dataclass(frozen=True, slots=True)
class _Earlier:
    """The conversation so far, the kvferry session it runs on, and the link a record keeps."""

    messages: list[ChatDict]
    session_id: str | None
    previous_response_id: str | None = None
    conversation_at: int = 0


async def _earlier(ctx: ApiContext, body: ResponsesBody, tenant: str, response_id: str) -> _Earlier:
    redis, ttl_s = ctx.jobs.redis, ctx.config.response_ttl_s
    if body.previous_response_id and body.conversation_id:
        raise InvalidRequestError("previous_response_id and conversation exclude each other", "conversation")
    if body.previous_response_id:
        previous = await records.load(redis, tenant, body.previous_response_id)
        if previous is None:
            raise _not_found("Previous response", body.previous_response_id, "previous_response_id")
        previous = await refresh(ctx, previous)
        if previous.status not in ("completed", "incomplete"):
            raise InvalidRequestError(
                f"previous response {previous.id} is {previous.status}: only an ended one continues",
                "previous_response_id",
            )
        earlier = await chain.messages(redis, previous, ttl_s)
        return _Earlier(earlier, previous.session_id, previous_response_id=previous.id)
    if body.conversation_id:
        if await conversations.get(redis, tenant, body.conversation_id) is None:
            raise _not_found("Conversation", body.conversation_id, "conversation")
        earlier = await chain.conversation_items(redis, tenant, body.conversation_id)
        return _Earlier(earlier, body.conversation_id, conversation_at=len(earlier))
    if body.prompt_cache_key:
        return _Earlier([], cache_key.session_of(body.prompt_cache_key))
    return _Earlier([], response_id if body.stored else None)


def _item_types(raw: Any) -> None:
    """An input item of a type kvferry does not take (reasoning, a file, an image...): a 400
    naming it, not the union's first complaint."""
    items = raw.get("input") if isinstance(raw, dict) else None
    for i, item in enumerate(items if isinstance(items, list) else ()):
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind not in KNOWN_ITEMS:
            raise unsupported_parameter(
                f"input[{i}].type", f"input[{i}]: item type {kind!r} is not supported"
            )


def _check(body: ResponsesBody) -> None:
    if body.background and not body.stored:
        raise InvalidRequestError(
            "background responses are stored: background needs store true", "background"
        )
    if body.top_logprobs is not None and not body.wants_logprobs:
        raise InvalidRequestError(
            "top_logprobs needs include ['message.output_text.logprobs']", "top_logprobs"
        )


async def create(ctx: ApiContext, raw: Any, tenant: str, alive: Callable[[], Awaitable[bool]]) -> Response:
    _item_types(raw)
    body = validate(ResponsesBody, raw)
    _check(body)
    response_id = f"resp_{uuid.uuid4().hex}"
    earlier = await _earlier(ctx, body, tenant, response_id)
    chat = chat_body(body, earlier.messages, earlier.session_id)
    request = intake.parse(ctx, "/v1/chat/completions", chat, None)
    meta = await intake.submit(ctx, request, tenant)
    status = "queued" if body.background else "in_progress"
    calling = request.tool_calling
    record = ResponseRecord(
        id=response_id,
        tenant=tenant,
        job_id=meta.job_id,
        body=render.skeleton(body, response_id, status),
        own_messages=chat_messages(body.input),
        input_items=input_item_bodies(body.input, response_id),
        previous_response_id=earlier.previous_response_id,
        conversation_id=body.conversation_id,
        conversation_at=earlier.conversation_at,
        session_id=earlier.session_id,
        tool_parser=calling.parser if calling is not None else None,
        logprobs=body.wants_logprobs,
        stored=body.stored,
        first_status=status,
    )
    await records.save(ctx.jobs.redis, record, ctx.config.response_ttl_s, new=True)
    if body.background:
        watcher = asyncio.create_task(_watch(ctx, record), name=f"response {response_id}")
        _watchers.add(watcher)
        watcher.add_done_callback(_watchers.discard)
        if body.stream:
            return await stream_response(ctx, record, None, starting_after=-1, owns_job=False)
        return JSONResponse(record.body)
    if body.stream:
        return await stream_response(ctx, record, alive, starting_after=-1, owns_job=True)
    try:
        event = await ctx.jobs.wait_final(meta.job_id, ctx.config.job_timeout_s, alive)
    except (JobTimeoutError, ClientGoneError) as exc:
        return await gave_up(ctx, meta, exc)
    done = await finish(ctx, record, event, seen_live=True)
    if isinstance(event, JobFailed):  # as a chat completion's: its status code, its error body
        return failed_response(event)
    return JSONResponse(done.body)


async def _watch(ctx: ApiContext, record: ResponseRecord) -> None:
    """A background response's end, recorded as soon as it comes (a GET would find it too)."""
    try:
        event = await ctx.jobs.wait_final(record.job_id, ctx.config.job_timeout_s)
        await finish(ctx, record, event, seen_live=True)
    except Exception as exc:  # a GET settles it from the job's stream
        log.warning("background response %s: %s", record.id, exc)
