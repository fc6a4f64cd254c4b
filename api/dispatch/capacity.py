"""Capacity for batch lines: the batch runner feeds a batch's lines only while free_slots(ctx) > 0,
so a batch fills idle seats of the window and never stands in front of interactive jobs."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis

from api.jobs.admission import window_of
from broker import keys

if TYPE_CHECKING:
    from api.context import ApiContext


async def occupied(client: aioredis.Redis) -> tuple[int, int]:
    """(released unfinished jobs past no deadline, parked jobs), in one round trip."""
    pipe = client.pipeline(transaction=False)
    pipe.zcount(keys.INFLIGHT, f"({time.time()!r}", "+inf")
    pipe.zcard(keys.PARKED)
    replies: Any = await pipe.execute()
    return int(replies[0]), int(replies[1])


async def free_slots(ctx: ApiContext) -> int:
    """The window less released unfinished jobs (interactive and batch) less parked jobs; 0 when no
    window is known (no live worker says its concurrency): a batch waits for a worker."""
    window = window_of(await ctx.jobs.fleet.workers(ctx.jobs.redis), ctx.config.dispatch_headroom)
    if window <= 0:
        return 0
    inflight, parked = await occupied(ctx.jobs.redis)
    return max(0, window - inflight - parked)
