"""Stored responses on a real redis-server: each record holds its own turn and a link, the chain
rebuilds the conversation (a missing link a 400 naming previous_response_id), every key has a
TTL, a crafted id reads no other key, and a response deleted while it ran stays deleted."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import redis
import redis.asyncio as aioredis

from api.responses import chain, conversations
from api.responses import record as records
from api.responses.record import ResponseRecord
from broker import keys
from broker.errors import InvalidRequestError

TTL = 1000
T = TypeVar("T")


def _run(redis_url: str, go: Callable[[aioredis.Redis], Awaitable[T]]) -> T:
    async def main() -> T:
        client = aioredis.Redis.from_url(redis_url)
        try:
            return await go(client)
        finally:
            await client.aclose()

    return asyncio.run(main())


def _turn(i: int, previous: str | None, tenant: str = "t") -> ResponseRecord:
    return ResponseRecord(
        id=f"resp_{i}",
        tenant=tenant,
        job_id=f"j{i}",
        body={"id": f"resp_{i}", "status": "completed", "output": []},
        own_messages=[{"role": "user", "content": f"question {i} " + "x" * 200}],
        answer={"role": "assistant", "content": f"answer {i}"},
        previous_response_id=previous,
    )


def _chain_of(n: int) -> list[ResponseRecord]:
    return [_turn(i, f"resp_{i - 1}" if i else None) for i in range(n)]


def test_a_chain_stores_each_turn_once_and_rebuilds_the_whole_conversation(
    rds: redis.Redis, redis_url: str
) -> None:
    turns = _chain_of(12)

    async def go(client: aioredis.Redis) -> list[dict[str, Any]]:
        for r in turns:
            await records.save(client, r, TTL, new=True)
        return await chain.messages(client, turns[-1], TTL)

    rebuilt = _run(redis_url, go)
    assert rebuilt == [m for r in turns for m in r.turn]
    sizes = [rds.strlen(keys.response_record("t", r.id)) for r in turns]
    assert max(sizes) - min(sizes) < 20, sizes  # linear storage: no record holds earlier turns
    for r in turns:
        assert 0 < rds.ttl(keys.response_record("t", r.id)) <= TTL


def test_a_missing_link_is_a_400_naming_previous_response_id(rds: redis.Redis, redis_url: str) -> None:
    turns = _chain_of(4)

    async def go(client: aioredis.Redis) -> list[dict[str, Any]]:
        for r in turns:
            await records.save(client, r, TTL, new=True)
        await records.delete(client, "t", "resp_1")
        return await chain.messages(client, turns[-1], TTL)

    with pytest.raises(InvalidRequestError) as raised:
        _run(redis_url, go)
    assert raised.value.param == "previous_response_id" and "resp_1" in str(raised.value)


def test_a_chain_starting_in_a_conversation_takes_its_items_up_to_that_response(
    rds: redis.Redis, redis_url: str
) -> None:
    first = {"type": "message", "role": "user", "content": "earlier"}

    async def go(client: aioredis.Redis) -> list[dict[str, Any]]:
        doc = await conversations.create(client, "t", {}, [first], TTL)
        root = ResponseRecord(
            id="resp_c",
            tenant="t",
            job_id="j",
            body={"status": "completed"},
            own_messages=[{"role": "user", "content": "now"}],
            answer={"role": "assistant", "content": "ok"},
            conversation_id=doc["id"],
            conversation_at=1,
        )
        await conversations.append(client, "t", doc["id"], [{**first, "content": "later"}], TTL)
        return await chain.messages(client, root, TTL)

    assert [m["content"] for m in _run(redis_url, go)] == ["earlier", "now", "ok"]
    for key in rds.keys("*"):
        assert 0 < rds.ttl(key) <= TTL, key


def test_a_crafted_id_reads_no_other_key(rds: redis.Redis, redis_url: str) -> None:
    async def go(client: aioredis.Redis) -> list[ResponseRecord | None]:
        r = _turn(0, None)
        await records.save(client, r, TTL, new=True)
        assert await records.claim_end(client, r, TTL)
        return [await records.load(client, "t", f"{r.id}{tail}") for tail in (":final", ":record", "")]

    assert [r.id if r else None for r in _run(redis_url, go)] == [None, None, "resp_0"]


def test_a_response_deleted_while_it_ran_stays_deleted(rds: redis.Redis, redis_url: str) -> None:
    async def go(client: aioredis.Redis) -> ResponseRecord | None:
        r = _turn(0, None)
        await records.save(client, r, TTL, new=True)
        await records.delete(client, "t", r.id)
        await records.save(client, r, TTL)  # its end, recorded after the DELETE
        return await records.load(client, "t", r.id)

    assert _run(redis_url, go) is None
    assert rds.keys("*") == []
