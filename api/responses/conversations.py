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
from redis.asyncio.client import Pipeline
from redis.exceptions import WatchError

from broker import keys

MAX_ITEMS = 4096  # as a chat body's messages


def new_id() -> str:
    return f"conv_{uuid.uuid4().hex}"


def body(conversation_id: str, created_at: int, metadata: dict[str, str]) -> dict[str, Any]:
    return {"id": conversation_id, "object": "conversation", "created_at": created_at, "metadata": metadata}


def with_ids(conversation_id: str, items: list[dict[str, Any]], start: int) -> list[dict[str, Any]]:
    key = conversation_id.removeprefix("conv_")
    return [{**item, "id": item.get("id") or f"item_{key}_{start + i}"} for i, item in enumerate(items)]


def decode(raw: bytes | str) -> dict[str, Any]:
    item: dict[str, Any] = json.loads(raw)
    return item


async def create(
    redis: aioredis.Redis, tenant: str, metadata: dict[str, str], items: list[dict[str, Any]], ttl_s: int
) -> dict[str, Any]:
    conversation_id = new_id()
    doc = body(conversation_id, int(time.time()), metadata)
    pipe = redis.pipeline(transaction=True)
    pipe.set(keys.conversation_record(tenant, conversation_id), json.dumps(doc), ex=ttl_s)
    if items:
        pipe.rpush(
            keys.conversation_items(tenant, conversation_id),
            *(json.dumps(i) for i in with_ids(conversation_id, items, 0)),
        )
        pipe.expire(keys.conversation_items(tenant, conversation_id), ttl_s)
    await pipe.execute()
    return doc


async def get(redis: aioredis.Redis, tenant: str, conversation_id: str) -> dict[str, Any] | None:
    raw: Any = await redis.get(keys.conversation_record(tenant, conversation_id))
    return json.loads(raw) if raw is not None else None


async def delete(redis: aioredis.Redis, tenant: str, conversation_id: str) -> bool:
    removed: Any = await redis.delete(
        keys.conversation_record(tenant, conversation_id), keys.conversation_items(tenant, conversation_id)
    )
    return bool(removed)


async def items(redis: aioredis.Redis, tenant: str, conversation_id: str) -> list[dict[str, Any]]:
    raw: Any = await redis.lrange(keys.conversation_items(tenant, conversation_id), 0, -1)
    return [decode(r) for r in raw]


def queue_append(
    pipe: Pipeline, tenant: str, conversation_id: str, added: list[dict[str, Any]], ttl_s: int
) -> None:
    """Queue the append of `added` (with their ids) on a transaction: items, then both TTLs renewed."""
    list_key = keys.conversation_items(tenant, conversation_id)
    pipe.rpush(list_key, *(json.dumps(i) for i in added))
    pipe.expire(list_key, ttl_s)
    pipe.expire(keys.conversation_record(tenant, conversation_id), ttl_s)


async def append(
    redis: aioredis.Redis, tenant: str, conversation_id: str, new: list[dict[str, Any]], ttl_s: int
) -> list[dict[str, Any]]:
    """Append items (ids given to those without one, numbered after what the list holds: the count
    is watched, so two appends at once never give one id twice); renews the conversation's TTL."""
    if not new:
        return []
    list_key = keys.conversation_items(tenant, conversation_id)
    async with redis.pipeline(transaction=True) as pipe:
        while True:
            try:
                await pipe.watch(list_key)
                added = with_ids(conversation_id, new, int(await pipe.llen(list_key)))
                pipe.multi()
                queue_append(pipe, tenant, conversation_id, added, ttl_s)
                await pipe.execute()
                return added
            except WatchError:
                continue
