"""A stored response: what GET shows (its body) and what continuing it needs: its own input as chat
messages and its answer, and a link to what it continued (its previous response, or the first
items of a conversation), so storage grows by one turn per turn (api/responses/chain.py rebuilds
the conversation by walking the links); its kvferry session and its job."""

from __future__ import annotations

from typing import Any

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import WatchError

from api.responses import conversations
from broker import keys

FINAL_STATUSES = frozenset({"completed", "incomplete", "failed", "cancelled"})


class ResponseRecord(msgspec.Struct, kw_only=True):
    id: str
    tenant: str
    job_id: str
    body: dict[str, Any]  # the response object as GET returns it
    own_messages: list[dict[str, Any]] = []  # this response's input as chat messages
    answer: dict[str, Any] | None = None  # the assistant message, once ended
    input_items: list[dict[str, Any]] = []
    previous_response_id: str | None = None  # the response this one continues (a link, not a copy)
    conversation_id: str | None = None
    conversation_at: int = 0  # the conversation's items this response followed (its first N)
    session_id: str | None = None
    tool_parser: str | None = None  # the parser of the answer's tool calls (None: no tools)
    logprobs: bool = False  # include message.output_text.logprobs
    stored: bool = True
    first_status: str = "in_progress"  # the status response.created showed (replayed streams)

    @property
    def status(self) -> str:
        return str(self.body["status"])

    @property
    def ended(self) -> bool:
        return self.status in FINAL_STATUSES

    @property
    def turn(self) -> list[dict[str, Any]]:
        """This response's own messages: its input, then its answer."""
        return [*self.own_messages, *([self.answer] if self.answer else [])]


_decoder = msgspec.json.Decoder(ResponseRecord)


async def load(redis: aioredis.Redis, tenant: str, response_id: str) -> ResponseRecord | None:
    raw: Any = await redis.get(keys.response_record(tenant, response_id))
    return _decoder.decode(raw) if raw is not None else None


async def save(redis: aioredis.Redis, record: ResponseRecord, ttl_s: int, new: bool = False) -> None:
    """Keep the record (if stored). An update (`new` false) writes only over the record still there:
    a response deleted while it ran stays deleted when its end comes."""
    if record.stored:
        key = keys.response_record(record.tenant, record.id)
        await redis.set(key, msgspec.json.encode(record), ex=ttl_s, xx=not new)


async def end_once(
    redis: aioredis.Redis, done: ResponseRecord, new_items: list[dict[str, Any]], ttl_s: int
) -> bool:
    """Apply a stored response's end once, whoever calls first (True for that one): its end
    marker, its ended record and its items appended to its conversation in one transaction, so
    an api that dies mid-way leaves all of it or none (a GET's refresh applies it then). A
    conversation deleted meanwhile gets nothing (no list of items without its record)."""
    final = keys.response_final(done.tenant, done.id)
    conversation = done.conversation_id if new_items else None
    watched = [final]
    if conversation:
        watched += [keys.conversation_items(done.tenant, conversation)]
        watched += [keys.conversation_record(done.tenant, conversation)]
    async with redis.pipeline(transaction=True) as pipe:
        while True:
            try:
                await pipe.watch(*watched)
                if await pipe.exists(final):
                    return False
                if conversation and not await pipe.exists(watched[2]):
                    conversation = None
                start = int(await pipe.llen(watched[1])) if conversation else 0
                pipe.multi()
                pipe.set(final, b"1", ex=ttl_s)
                pipe.set(
                    keys.response_record(done.tenant, done.id), msgspec.json.encode(done), ex=ttl_s, xx=True
                )
                if conversation:
                    added = conversations.with_ids(conversation, new_items, start)
                    conversations.queue_append(pipe, done.tenant, conversation, added, ttl_s)
                await pipe.execute()
                return True
            except WatchError:
                continue


async def delete(redis: aioredis.Redis, tenant: str, response_id: str) -> bool:
    removed: Any = await redis.delete(keys.response_record(tenant, response_id))
    return bool(removed)
