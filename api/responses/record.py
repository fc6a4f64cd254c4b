"""A stored response: what GET shows (its body) and what continuing it needs (the conversation
so far as chat messages, its kvferry session, its job)."""

from __future__ import annotations

from typing import Any

import msgspec
import redis.asyncio as aioredis

from api.responses import keys

FINAL_STATUSES = frozenset({"completed", "incomplete", "failed", "cancelled"})


class ResponseRecord(msgspec.Struct, kw_only=True):
    id: str
    tenant: str
    job_id: str
    body: dict[str, Any]  # the response object as GET returns it
    history: list[dict[str, Any]]  # chat messages before the answer: earlier turns + this input
    answer: dict[str, Any] | None = None  # the assistant message, once ended
    input_items: list[dict[str, Any]] = []
    session_id: str | None = None
    tool_parser: str | None = None  # the parser of the answer's tool calls (None: no tools)
    logprobs: bool = False  # include message.output_text.logprobs
    conversation_id: str | None = None
    stored: bool = True
    first_status: str = "in_progress"  # the status response.created showed (replayed streams)

    @property
    def status(self) -> str:
        return str(self.body["status"])

    @property
    def ended(self) -> bool:
        return self.status in FINAL_STATUSES

    @property
    def conversation(self) -> list[dict[str, Any]]:
        """The messages a response continuing this one starts with."""
        return [*self.history, *([self.answer] if self.answer else [])]


_decoder = msgspec.json.Decoder(ResponseRecord)


async def load(redis: aioredis.Redis, tenant: str, response_id: str) -> ResponseRecord | None:
    raw: Any = await redis.get(keys.response(tenant, response_id))
    return _decoder.decode(raw) if raw is not None else None


async def save(redis: aioredis.Redis, record: ResponseRecord) -> None:
    if record.stored:
        await redis.set(
            keys.response(record.tenant, record.id), msgspec.json.encode(record), ex=keys.RESPONSE_TTL_S
        )


async def claim_end(redis: aioredis.Redis, record: ResponseRecord) -> bool:
    """True for the one caller that applies the response's end (its output, its conversation)."""
    return bool(
        await redis.set(keys.response_final(record.tenant, record.id), b"1", nx=True, ex=keys.RESPONSE_TTL_S)
    )


async def delete(redis: aioredis.Redis, tenant: str, response_id: str) -> bool:
    return bool(await redis.delete(keys.response(tenant, response_id)))
