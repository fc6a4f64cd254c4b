"""Capacity for batch lines, counted in jobs (engine seats): the batch runner feeds a batch's lines
only while seats are free, so batch jobs fill the idle part of the batch window and never stand in
front of interactive jobs: those released (keys.INFLIGHT) and parked count against it first.

The batch window is each live worker's concurrency less dispatch_headroom, but never less than one
seat a worker: with a concurrency at or below the headroom a batch still makes progress (one job
at a time on each worker) instead of waiting for ever."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis

from api.routing.fleet import WorkerView
from broker import keys

if TYPE_CHECKING:
    from api.context import ApiContext


@dataclass(frozen=True, slots=True)
class Seats:
    window: int  # the batch window: jobs every batch may run at once
    free: int  # the window less what runs or waits in it now
    workers: dict[str, int] = field(default_factory=dict)  # each live worker's batch window


def worker_seats(views: Iterable[WorkerView], headroom: int) -> dict[str, int]:
    """Each live worker's batch window, for those that say their concurrency: at least one (workers
    with threads above their seats let batch jobs fill every seat; an interactive job then takes a
    batch sequence's seat in the engine)."""
    return {
        view.name: max(1, view.status.concurrency - headroom)
        for view in views
        if view.live and view.status is not None and view.status.concurrency > 0
    }


async def occupied(client: aioredis.Redis) -> tuple[int, int]:
    """(released unfinished interactive jobs past no deadline, parked jobs), in one round trip."""
    pipe = client.pipeline(transaction=False)
    pipe.zcount(keys.INFLIGHT, f"({time.time()!r}", "+inf")
    pipe.zcard(keys.PARKED)
    replies: Any = await pipe.execute()
    return int(replies[0]), int(replies[1])


async def seats(ctx: ApiContext, batch_running: int = 0) -> Seats:
    """The batch window, and what is free of it: less released interactive jobs, parked jobs and
    the batch jobs running now (`batch_running`, the runner's own count of its lines' jobs); no
    window (0) when no live worker says its concurrency: a batch waits for a worker."""
    views = await ctx.jobs.fleet.workers(ctx.jobs.redis)
    per_worker = worker_seats(views, ctx.config.dispatch_headroom)
    window = sum(per_worker.values())
    if window <= 0:
        return Seats(0, 0)
    inflight, parked = await occupied(ctx.jobs.redis)
    return Seats(window, max(0, window - inflight - parked - batch_running), per_worker)


async def free_slots(ctx: ApiContext, batch_running: int = 0) -> int:
    """The seats free for batch jobs now (Seats.free)."""
    return (await seats(ctx, batch_running)).free
