"""Stored responses on a real redis-server: each record holds its own turn and a link, the chain
rebuilds the conversation (a missing link a 400 naming previous_response_id), every key has a
TTL, a crafted id reads no other key, a response deleted while it ran stays deleted, and its end
is applied whole and once even when an api dies applying it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
import redis
import redis.asyncio as aioredis

from api.responses import chain, conversations
from api.responses import record as records
from api.responses.body import ResponsesBody
from api.responses.record import ResponseRecord
from api.responses.render import skeleton
from api.responses.settle import finish
from api.schema.validation import validate
from broker import keys
from broker.errors import InvalidRequestError
from broker.messages import GenerateResult, JobDone, Usage

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
        assert await records.end_once(client, r, [], TTL)  # its end marker is set
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


def test_an_api_dying_mid_settle_leaves_the_whole_end_to_the_next_reader(
    rds: redis.Redis, redis_url: str
) -> None:
    """The end marker, the ended record and the conversation's new items are one transaction: an
    api that dies after taking the marker once left the response in_progress for good (the next
    reader found the marker taken and nothing applied)."""
    body = validate(ResponsesBody, {"model": "m", "input": "hi"})
    usage = Usage(prompt_tokens=10, completion_tokens=3, cached_tokens=4)
    event = JobDone(result=GenerateResult("j", "m", "Hello!", (1, 2, 3), "stop", usage, "w1", 0.0, 0.0, 0.0))

    async def go(client: aioredis.Redis) -> tuple[ResponseRecord | None, list[dict[str, Any]]]:
        doc = await conversations.create(client, "t", {}, [], TTL)
        record = ResponseRecord(
            id="resp_0",
            tenant="t",
            job_id="j",
            body=skeleton(body, "resp_0", "in_progress"),
            input_items=[{"id": "msg_in", "type": "message", "role": "user", "content": []}],
            conversation_id=doc["id"],
        )
        await records.save(client, record, TTL, new=True)

        async def no_meta(job_id: str) -> None:
            return None

        def ctx(c: aioredis.Redis) -> Any:
            jobs = SimpleNamespace(redis=c, meta=no_meta)
            return SimpleNamespace(jobs=jobs, config=SimpleNamespace(response_ttl_s=TTL))

        dying = aioredis.Redis.from_url(redis_url)
        writes = 0
        real = dying.execute_command

        async def dies_after_one_write(*args: Any, **options: Any) -> Any:
            nonlocal writes
            if str(args[0]).upper() in ("SET", "RPUSH", "EXPIRE"):
                writes += 1
                if writes > 1:
                    raise redis.ConnectionError("the api died")
            return await real(*args, **options)

        dying.execute_command = dies_after_one_write  # type: ignore[method-assign]
        with contextlib.suppress(redis.ConnectionError):
            await finish(ctx(dying), record, event, seen_live=False)
        await dying.aclose()
        await finish(ctx(client), record, event, seen_live=False)  # a GET's refresh, later
        await finish(ctx(client), record, event, seen_live=False)  # and another: nothing more
        return await records.load(client, "t", "resp_0"), await conversations.items(client, "t", doc["id"])

    stored, items = _run(redis_url, go)
    assert stored is not None and stored.status == "completed", stored
    assert [i["type"] for i in items] == ["message", "message"], items  # the input, the answer: once


def test_a_conversation_deleted_while_its_response_ran_gets_nothing_back(
    rds: redis.Redis, redis_url: str
) -> None:
    item = {"type": "message", "role": "user", "content": "hi"}

    async def go(client: aioredis.Redis) -> bool:
        doc = await conversations.create(client, "t", {}, [], TTL)
        r = ResponseRecord(
            id="resp_0", tenant="t", job_id="j", body={"status": "completed"}, conversation_id=doc["id"]
        )
        await records.save(client, r, TTL, new=True)
        await conversations.delete(client, "t", doc["id"])
        return await records.end_once(client, r, [item], TTL)

    assert _run(redis_url, go)  # the response's end is applied
    assert not any(b"conversation" in k for k in rds.keys("*")), rds.keys("*")
