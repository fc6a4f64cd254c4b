"""The router's decision time at fleet scale, in this process against a real Redis: `workers`
live heartbeats and `digests` advertised prefix digests per worker (broker/routing/prefix_index.py), each
digest held by MAX_HOLDERS workers (the most a digest keeps, so the largest reply a lookup reads).
A decision is api/routing/router.py's choose_queue for a chat whose first message some workers served,
with the api process's fleet cache as the api uses it."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import redis
import redis.asyncio as aioredis

from api.routing.fleet import FleetCache
from api.routing.memory import RoutingMemory
from api.routing.router import choose_queue
from broker import keys
from broker.messages import ChatMessage, EngineFigures, GenerateJob, WorkerStatus
from broker.routing import prefix_index
from broker.routing.prefix_digest import chat_digests
from broker.worker_registry import HEARTBEAT_FIELD, encode_status
from ops.bench.queue.stages import pct

MODEL = "simulated"


def _system(i: int) -> ChatMessage:
    return ChatMessage("system", f"synthetic system prompt {i}")


def populate(client: redis.Redis, workers: int, digests: int) -> int:
    """Heartbeats for `workers` and `digests` digests per worker, spread so each digest has
    MAX_HOLDERS holders; returns how many distinct digests there are."""
    holders = min(workers, prefix_index.MAX_HOLDERS)
    pool = max(1, workers * digests // holders)
    names = [f"route{w}@bench" for w in range(workers)]
    figures = EngineFigures(0, 0, 0, 0, 0, 10, 0, 0, 1, 0, 0, 0.0, 0, 0)
    for name in names:
        status = WorkerStatus(name, keys.worker_queue(name), MODEL, 0, 0, 0, time.time(), figures)
        client.hset(keys.worker_heartbeat(name), HEARTBEAT_FIELD, encode_status(status))
        client.expire(keys.worker_heartbeat(name), 600)
        client.sadd(keys.WORKERS, name)
    stride = max(1, pool // workers)
    pipe = client.pipeline(transaction=False)
    for i in range(pool):
        digest = chat_digests(MODEL, "", [_system(i)])[0]
        first = (i // stride) % workers  # the digest's holders: `holders` consecutive workers
        pipe.zadd(keys.prefix_holders(digest), {names[(first + h) % workers]: 1.0 for h in range(holders)})
        if len(pipe) >= 5000:
            pipe.execute()
    pipe.execute()
    return pool


async def _decisions(url: str, pool: int, lookups: int) -> list[float]:
    client = aioredis.Redis.from_url(url)
    cache, memory = FleetCache(), RoutingMemory()
    took = []
    try:
        for n in range(lookups):
            i = (n * 7919) % pool
            job = GenerateJob(MODEL, endpoint="chat", messages=(_system(i), ChatMessage("user", f"q{n}")))
            started = time.perf_counter()
            route = await choose_queue(
                client, job, "cache-aware", max_waiting=8, prefetch_hints=False, cache=cache, memory=memory
            )
            took.append(time.perf_counter() - started)
            assert route.reason.startswith(("prefix match", "load balance")), route
    finally:
        await client.aclose()
    return took


def route_p99_ms(
    url: str, workers: int, digests: int, lookups: int = 1000, rounds: int = 5
) -> dict[str, Any]:
    """p50 and p99 of the decision time. The p99 is the median of `rounds` rounds' p99s: on a
    machine shared with other work, a preempted round (its 10 slowest decisions) says more about
    the machine than about the router; the pooled p99 is reported too."""
    client = redis.Redis.from_url(url)
    client.flushall()
    pool = populate(client, workers, digests)
    runs = [
        asyncio.run(_decisions(url, pool, lookups))[lookups // 10 :] for _ in range(rounds)
    ]  # past warm-ups
    client.flushall()
    client.close()
    pooled = [t for run in runs for t in run]
    return {
        "route_workers": workers,
        "route_digests_per_worker": digests,
        "route_p50_ms": round(pct(pooled, 50) * 1000, 3),
        "route_p99_ms": round(statistics.median(pct(run, 99) for run in runs) * 1000, 3),
        "route_p99_ms_rounds": [round(pct(run, 99) * 1000, 3) for run in runs],
        "route_p99_ms_pooled": round(pct(pooled, 99) * 1000, 3),
    }
