"""Capacity for batch lines: the batch runner feeds a batch's lines only while free_slots > 0, so
batch lines fill the idle part of the batch window (api/jobs/admission.py) and never stand in front
of interactive jobs: those released (keys.INFLIGHT) and parked count against it first."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis

from api.jobs.admission import window_of
from broker import keys

if TYPE_CHECKING:
    from api.context import ApiContext


async def occupied(client: aioredis.Redis) -> tuple[int, int]:
    """(released unfinished interactive jobs past no deadline, parked jobs), in one round trip."""
    pipe = client.pipeline(transaction=False)
    pipe.zcount(keys.INFLIGHT, f"({time.time()!r}", "+inf")
    pipe.zcard(keys.PARKED)
    replies: Any = await pipe.execute()
    return int(replies[0]), int(replies[1])


async def free_slots(ctx: ApiContext, batch_running: int = 0) -> int:
    """The batch window less released interactive jobs, parked jobs and the batch jobs running now
    (`batch_running`, the runner's own count); 0 when no window is known (no live worker says its
    concurrency): a batch waits for a worker."""
    views = await ctx.jobs.fleet.workers(ctx.jobs.redis)
    window = window_of(views, ctx.config.dispatch_headroom, batch=True)
    if window <= 0:
        return 0
    inflight, parked = await occupied(ctx.jobs.redis)
    return max(0, window - inflight - parked - batch_running)
