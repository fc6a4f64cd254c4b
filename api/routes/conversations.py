"""OpenAI's Conversations API: a named, durable conversation (its items in the queue Redis, its
id its kvferry session); `conversation` on a response continues it and appends to it."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import Field

from api import intake
from api.auth import Tenant
from api.context import Ctx
from api.responses import conversations
from api.responses.body import InputItem, Metadata
from api.responses.items import input_item_bodies
from api.responses.listing import Paging, list_body, not_found, page
from api.schema.openapi_doc import body_of
from api.schema.strict import Strict
from api.schema.validation import validate

router = APIRouter(prefix="/v1/conversations")


class ConversationBody(Strict):
    items: Annotated[list[InputItem], Field(max_length=conversations.MAX_ITEMS)] | None = None
    metadata: Metadata | None = None


class ItemsBody(Strict):
    items: Annotated[list[InputItem], Field(min_length=1, max_length=conversations.MAX_ITEMS)]


def _bodies(items: list[Any], conversation_id: str) -> list[dict[str, Any]]:
    bodies = input_item_bodies(items, conversation_id)
    for body, item in zip(bodies, items, strict=True):
        if item.id is None:
            del body["id"]  # the store numbers it
    return bodies


async def _conversation(ctx: Ctx, tenant: str, conversation_id: str) -> dict[str, Any]:
    doc = await conversations.get(ctx.jobs.redis, tenant, conversation_id)
    if doc is None:
        raise not_found("Conversation", conversation_id)
    return doc


@router.post("", openapi_extra=body_of(ConversationBody))
async def create_conversation(request: Request, ctx: Ctx, tenant: Tenant) -> dict[str, Any]:
    body = validate(ConversationBody, await intake.read_json(request, ctx.config.max_body_bytes))
    items = _bodies(body.items or [], "conv_new")
    return await conversations.create(
        ctx.jobs.redis, tenant, body.metadata or {}, items, ctx.config.response_ttl_s
    )


@router.get("/{conversation_id}")
async def get_conversation(conversation_id: str, ctx: Ctx, tenant: Tenant) -> dict[str, Any]:
    return await _conversation(ctx, tenant, conversation_id)


@router.delete("/{conversation_id}")
async def delete_conversation(conversation_id: str, ctx: Ctx, tenant: Tenant) -> dict[str, Any]:
    await _conversation(ctx, tenant, conversation_id)
    await conversations.delete(ctx.jobs.redis, tenant, conversation_id)
    return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}


@router.get("/{conversation_id}/items")
async def list_items(conversation_id: str, ctx: Ctx, tenant: Tenant, paging: Paging) -> dict[str, Any]:
    await _conversation(ctx, tenant, conversation_id)
    return page(await conversations.items(ctx.jobs.redis, tenant, conversation_id), paging)


@router.post("/{conversation_id}/items", openapi_extra=body_of(ItemsBody))
async def create_items(conversation_id: str, request: Request, ctx: Ctx, tenant: Tenant) -> dict[str, Any]:
    await _conversation(ctx, tenant, conversation_id)
    body = validate(ItemsBody, await intake.read_json(request, ctx.config.max_body_bytes))
    new = _bodies(body.items, conversation_id)
    ttl_s = ctx.config.response_ttl_s
    added = await conversations.append(ctx.jobs.redis, tenant, conversation_id, new, ttl_s)
    return list_body(added)
