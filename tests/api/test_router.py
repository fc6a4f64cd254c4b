"""The router's decisions against real Redis state (heartbeats, prefix digests, session records)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis
import redis.asyncio as aioredis

from api.routing.memory import RoutingMemory
from api.routing.router import Route, choose_queue
from broker import keys
from broker.messages import ChatMessage, EngineFigures, GenerateJob, SessionRecord, WorkerStatus
from broker.routing import prefix_index
from broker.routing.prefix_digest import chat_digests
from broker.sessions import store as session_store
from broker.worker_registry import HEARTBEAT_FIELD, encode_status

SYSTEM = ChatMessage("system", "be brief")
MEMORY = RoutingMemory()  # one api process's, kept across this file's decisions (api/context.py)


def _beat(rds: redis.Redis, name: str, waiting: int = 0) -> None:
    figures = EngineFigures(0, waiting, 0, 0, 0, 10, 0, 0, 1, 0, 0, 0.0, 0, 0)
    status = WorkerStatus(name, keys.worker_queue(name), "m", 0, 0, 0, time.time(), figures)
    rds.hset(keys.worker_heartbeat(name), HEARTBEAT_FIELD, encode_status(status))
    rds.expire(keys.worker_heartbeat(name), 30)
    rds.sadd(keys.WORKERS, name)


def advertise(rds: redis.Redis, name: str, digests: list[str]) -> None:
    """What a worker's session keeper writes after serving these prefixes (broker/routing/prefix_index.py)."""
    pipe = rds.pipeline()
    prefix_index.advertise(pipe, name, digests, time.time())
    pipe.execute()


def _route(redis_url: str, job: GenerateJob, routing: str = "cache-aware") -> Route:
    async def go() -> Route:
        client = aioredis.Redis.from_url(redis_url)
        try:
            return await choose_queue(client, job, routing, max_waiting=4, memory=MEMORY)
        finally:
            await client.aclose()

    return asyncio.run(go())


def _job(*messages: ChatMessage, session: str | None = None) -> GenerateJob:
    return GenerateJob(model="m", endpoint="chat", messages=messages, session_id=session)


def test_no_worker_means_shared(rds: redis.Redis, redis_url: str) -> None:
    assert _route(redis_url, _job(SYSTEM)) == Route(keys.SHARED_QUEUE, "shared: no live worker")
    assert _route(redis_url, _job(SYSTEM), "shared") == Route(keys.SHARED_QUEUE, "shared: routing off")


def test_longest_prefix_wins_then_least_loaded(rds: redis.Redis, redis_url: str) -> None:
    _beat(rds, "a")
    _beat(rds, "b")
    question = ChatMessage("user", "q1")
    digests = chat_digests("m", "", [SYSTEM, question, ChatMessage("assistant", "a1")])
    advertise(rds, "a", digests[:1])  # a: the system prompt only
    advertise(rds, "b", digests)  # b: the whole first exchange
    follow_up = _job(SYSTEM, question, ChatMessage("assistant", "a1"), ChatMessage("user", "q2"))
    assert _route(redis_url, follow_up) == Route(keys.worker_queue("b"), "prefix match: 3/4 messages on b")
    # Both hold the system prompt: the less loaded one takes a new conversation.
    _beat(rds, "b", waiting=1)
    advertise(rds, "b", digests[:1])
    assert _route(redis_url, _job(SYSTEM, ChatMessage("user", "new"))).queue == keys.worker_queue("a")
    assert _route(redis_url, _job(ChatMessage("user", "unknown"))) == Route(
        keys.SHARED_QUEUE, "shared: no worker holds this prefix"
    )


def test_session_affinity_busy_and_gone(rds: redis.Redis, redis_url: str) -> None:
    _beat(rds, "a")
    record = SessionRecord("s1", "", "m", (1, 2, 3), (), "a", time.time(), 1)
    session_store.save(rds, record, 60)
    assert _route(redis_url, _job(SYSTEM, session="s1")) == Route(
        keys.worker_queue("a"), "session affinity: a"
    )
    _beat(rds, "a", waiting=9)  # over max_waiting
    assert _route(redis_url, _job(SYSTEM, session="s1")).reason.endswith("session's worker a is busy")
    rds.delete(keys.worker_heartbeat("a"))
    assert _route(redis_url, _job(SYSTEM, session="s1")).reason.endswith("session's worker a is gone")
    other_tenant = GenerateJob(model="m", endpoint="chat", messages=(SYSTEM,), session_id="s1", tenant="t2")
    assert "session" not in _route(redis_url, other_tenant).reason


def test_round_robin_alternates(rds: redis.Redis, redis_url: str) -> None:
    _beat(rds, "a")
    _beat(rds, "b")
    queues = {_route(redis_url, _job(SYSTEM), "round-robin").queue for _ in range(4)}
    assert queues == {keys.worker_queue("a"), keys.worker_queue("b")}


def test_a_burst_of_new_conversations_is_spread_before_heartbeats_catch_up(
    rds: redis.Redis, redis_url: str
) -> None:
    _beat(rds, "a")
    _beat(rds, "b")
    digest = chat_digests("m", "", [SYSTEM])[0]
    for name in ("a", "b"):
        advertise(rds, name, [digest])
    queues = [_route(redis_url, _job(SYSTEM, ChatMessage("user", f"q{i}"))).queue for i in range(10)]
    assert queues.count(keys.worker_queue("a")) == 5 and queues.count(keys.worker_queue("b")) == 5, queues


def test_affinity_gives_way_when_its_worker_is_clearly_busier(rds: redis.Redis, redis_url: str) -> None:
    """a is full (a sequence waits there): every job routed to it since waits too. The session
    leaves its worker only when that escapes more than one waiting sequence, and only for a worker
    with room (SESSION_MOVE_MARGIN, api/routing/cost.py)."""
    _beat(rds, "a", waiting=1)
    _beat(rds, "b")
    # Its last turn ended before the heartbeats (one ending after is no longer counted on a).
    session_store.save(rds, SessionRecord("hot", "", "m", (1,), (), "a", time.time() - 1, 1), 60)
    reasons = [_route(redis_url, _job(SYSTEM, session="hot")).reason for _ in range(3)]
    # It stays while a's queue is one long...
    assert reasons[0] == "session affinity: a", reasons
    assert reasons[1].startswith("load balance: b (a has 2 jobs, b 0; 2 and 0 waiting), expected"), reasons
    assert reasons[2].startswith("load balance: b (a has 2 jobs, b 1; 2 and 0 waiting)"), reasons
    # ...and comes back once b is full too: a move would reorder the queue, not shorten it.
    _beat(rds, "b", waiting=1)
    assert _route(redis_url, _job(SYSTEM, session="hot")).reason == "session affinity: a"


def test_a_decision_costs_redis_the_same_at_2_and_at_40_workers(private: tuple[redis.Redis, str]) -> None:
    """With the api's fleet cache warm, a route reads one key per digest of the job, none per
    worker (before: one ZMSCORE and one heartbeat read per worker, every job)."""
    rds, redis_url = private
    from api.routing.fleet import FleetCache

    def calls() -> int:
        stats: Any = rds.info("commandstats")
        return sum(int(v["calls"]) for v in stats.values())

    job = _job(SYSTEM, ChatMessage("user", "q"))
    cost = {}
    for n in (2, 40):
        rds.flushall()
        for i in range(n):
            _beat(rds, f"w{i}")
            advertise(rds, f"w{i}", chat_digests("m", "", [SYSTEM]))

        async def go() -> int:
            client = aioredis.Redis.from_url(redis_url)
            cache = FleetCache(ttl_s=60)
            try:
                await choose_queue(
                    client, job, max_waiting=4, cache=cache, memory=MEMORY
                )  # reads the fleet once
                before = calls()
                for _ in range(10):
                    await choose_queue(client, job, max_waiting=4, cache=cache, memory=MEMORY)
                return calls() - before - 1  # the INFO above
            finally:
                await client.aclose()

        cost[n] = asyncio.run(go())
    assert cost[2] == cost[40] <= 10 * 2, cost  # one ZRANGE per digest (2 here), per decision
