"""The conversation a response continues, rebuilt from the links its records keep: each stored
response holds only its own input and answer and the id of the response it continued (or how many
of a conversation's items it followed), so a chain of N turns stores N turns, not N²/2. Walking it
costs one Redis read per link, bounded by MAX_LINKS; a link gone (expired, deleted) is a 400 naming
previous_response_id. Continuing a chain renews every link's TTL: a chain lives as long as its
newest response."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from pydantic import TypeAdapter

from api.responses import conversations
from api.responses import record as records
from api.responses.body import InputItem
from api.responses.items import ChatDict, chat_messages
from api.responses.record import ResponseRecord
from broker import keys
from broker.errors import InvalidRequestError

MAX_LINKS = 1024  # responses in one previous_response_id chain
_items = TypeAdapter(list[InputItem])


async def conversation_items(
    redis: aioredis.Redis, tenant: str, conversation_id: str, first: int | None = None
) -> list[ChatDict]:
    """A conversation's items (its first `first`; None: all) as chat messages."""
    end = -1 if first is None else first - 1
    if end == -1 and first is not None:
        return []
    items: Any = await redis.lrange(keys.conversation_items(tenant, conversation_id), 0, end)
    return chat_messages(_items.validate_python([conversations.decode(i) for i in items]))


async def messages(redis: aioredis.Redis, last: ResponseRecord, ttl_s: int) -> list[ChatDict]:
    """The chat messages a response continuing `last` starts with: every turn of its chain."""
    chain = [last]
    while (link := chain[-1].previous_response_id) is not None:
        if len(chain) >= MAX_LINKS:
            raise InvalidRequestError(
                f"the previous_response_id chain is longer than {MAX_LINKS} responses",
                "previous_response_id",
            )
        earlier = await records.load(redis, last.tenant, link)
        if earlier is None:
            raise InvalidRequestError(
                f"response {link!r}, earlier in the previous_response_id chain, has expired or "
                "was deleted: the conversation cannot be rebuilt",
                "previous_response_id",
            )
        chain.append(earlier)
    root = chain[-1]
    out: list[ChatDict] = []
    if root.conversation_id is not None:
        out = await conversation_items(redis, last.tenant, root.conversation_id, root.conversation_at)
    for record in reversed(chain):
        out += record.turn
    pipe = redis.pipeline(transaction=False)
    for record in chain:
        pipe.expire(keys.response_record(record.tenant, record.id), ttl_s)
    await pipe.execute()
    return out
