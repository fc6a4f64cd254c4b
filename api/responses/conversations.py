"""Conversations in the queue Redis, per tenant: a record (its metadata) and its items in order
(a list of JSON items, each with an id). A response naming a conversation starts from its items
and appends its input and output to them; the conversation's id is its kvferry session, so each
turn continues the KV chain of the last."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import redis.asyncio as aioredis

from api.responses import keys

MAX_ITEMS = 4096  # as a chat body's messages


def new_id() -> str:
    return f"conv_{uuid.uuid4().hex}"


def body(conversation_id: str, created_at: int, metadata: dict[str, str]) -> dict[str, Any]:
    return {"id": conversation_id, "object": "conversation", "created_at": created_at, "metadata": metadata}


def _with_ids(conversation_id: str, items: list[dict[str, Any]], start: int) -> list[dict[str, Any]]:
    key = conversation_id.removeprefix("conv_")
    return [{**item, "id": item.get("id") or f"item_{key}_{start + i}"} for i, item in enumerate(items)]


async def create(
    redis: aioredis.Redis, tenant: str, metadata: dict[str, str], items: list[dict[str, Any]]
) -> dict[str, Any]:
    conversation_id = new_id()
    doc = body(conversation_id, int(time.time()), metadata)
    pipe = redis.pipeline(transaction=True)
    pipe.set(keys.conversation(tenant, conversation_id), json.dumps(doc), ex=keys.CONVERSATION_TTL_S)
    if items:
        pipe.rpush(
            keys.conversation_items(tenant, conversation_id),
            *(json.dumps(i) for i in _with_ids(conversation_id, items, 0)),
        )
        pipe.expire(keys.conversation_items(tenant, conversation_id), keys.CONVERSATION_TTL_S)
    await pipe.execute()
    return doc


async def get(redis: aioredis.Redis, tenant: str, conversation_id: str) -> dict[str, Any] | None:
    raw: Any = await redis.get(keys.conversation(tenant, conversation_id))
    return json.loads(raw) if raw is not None else None


async def delete(redis: aioredis.Redis, tenant: str, conversation_id: str) -> bool:
    removed: Any = await redis.delete(
        keys.conversation(tenant, conversation_id), keys.conversation_items(tenant, conversation_id)
    )
    return bool(removed)


async def items(redis: aioredis.Redis, tenant: str, conversation_id: str) -> list[dict[str, Any]]:
    raw: Any = await redis.lrange(keys.conversation_items(tenant, conversation_id), 0, -1)
    return [json.loads(r) for r in raw]


async def append(
    redis: aioredis.Redis, tenant: str, conversation_id: str, new: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Append items (ids given to those without one); renews the conversation's TTL."""
    if not new:
        return []
    list_key = keys.conversation_items(tenant, conversation_id)
    start: Any = await redis.llen(list_key)
    added = _with_ids(conversation_id, new, int(start))
    pipe = redis.pipeline(transaction=True)
    pipe.rpush(list_key, *(json.dumps(i) for i in added))
    pipe.expire(list_key, keys.CONVERSATION_TTL_S)
    pipe.expire(keys.conversation(tenant, conversation_id), keys.CONVERSATION_TTL_S)
    await pipe.execute()
    return added
