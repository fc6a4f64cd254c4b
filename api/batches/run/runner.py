"""The batch runner: one api replica at a time (a Redis lease, as the workers' sweeper lease)
runs every batch, in passes: validate a new batch (validating -> in_progress, or failed), collect
finished lines, end batches (completed, cancelled, expired), then feed lines while the fleet has
free seats (in jobs; fair between tenants by weight, the oldest batch of a tenant first).

Everything it knows is in Redis (records, cursors, running lines) and the file store (parts), so
another replica that takes the lease over, or this one restarted, resumes where it stopped. Every
write it makes is fenced by the lease's token (api/batches/lease.py, state.py): a runner that
lost the lease mid-pass stops at its next write, having written nothing more.

A batch whose input file is gone (deleted though the route refuses it while the batch runs, a
crash, an operator) fails alone, its finished lines in its files. A batch whose pass fails
otherwise is skipped for a while (doubling, up to BACKOFF_MAX_S), one warning each time: it
never holds the others up, nor floods the log."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections import Counter
from collections.abc import Awaitable
from typing import TypeVar

from redis.exceptions import RedisError

from api.background import FailureLog
from api.batches import records, state
from api.batches.input import validate
from api.batches.lease import RunnerLease
from api.batches.metrics import BatchMetrics
from api.batches.parts import Parts
from api.batches.records import BatchRecord, Status
from api.batches.run.collector import Collector
from api.batches.run.fair import shares
from api.batches.run.feeder import Running, feed
from api.batches.run.finalize import finalize
from api.batches.run.placement import Room
from api.context import ApiContext
from api.dispatch.capacity import seats
from api.dispatch.lease import api_name
from broker import keys

log = logging.getLogger(__name__)
T = TypeVar("T")
PASS_S = 0.1  # the longest rest between passes; a watched job's end cuts it short
WATCH_JOBS = 256  # running jobs whose end streams the rest watches (any end wakes the runner)
CANCEL_GRACE_S = 3.0  # a cancelled batch's running lines may still finish this long
BACKOFF_S = 1.0  # a batch whose pass failed is skipped this long, doubled at each failure in a row
BACKOFF_MAX_S = 60.0


class BatchRunner:
    def __init__(self, ctx: ApiContext, name: str | None = None) -> None:
        self.ctx = ctx
        self.metrics = BatchMetrics(ctx.metrics.registry)
        self.parts = Parts(ctx.files, self.metrics)
        self.collector = Collector(ctx, self.parts)
        # a runner that dies is replaced within the lease's TTL
        self.lease = RunnerLease(ctx.jobs.redis, name or api_name(), ctx.config.batch_lease_ttl_s)
        self.failures = FailureLog("batch runner", log)
        self._cancelled: set[str] = set()  # batches whose running jobs were cancelled
        self._backoff: dict[str, tuple[float, float]] = {}  # batch -> (skipped until, its delay)
        self._watch: list[str] = []  # end streams of jobs running at the last feed

    async def run(self) -> None:
        while True:
            try:
                if not await records.active(self.ctx.jobs.redis):
                    await self.release()  # no batch to run: no lease held, nothing written
                elif await self.lease.hold():
                    await self.run_pass()
                self.failures.passed()
            except asyncio.CancelledError:
                raise
            except state.LeaseLost:
                self.lease.lost()
            except Exception as exc:  # Redis down, a broker hiccup: the next pass tries again
                self.failures.failed(exc, expected=isinstance(exc, (RedisError, OSError)))
            await self._rest()

    async def release(self) -> None:
        await self.lease.release()

    async def _rest(self) -> None:
        """Until the next pass: PASS_S, or less when a watched job ends (an end written meanwhile
        is new to this read: "$"), so a finished line's seats are fed again at once."""
        watch, self._watch = self._watch, []
        if not watch:
            await asyncio.sleep(PASS_S)
            return
        try:
            await self.ctx.jobs.redis.xread(dict.fromkeys(watch, "$"), count=1, block=int(PASS_S * 1000))
        except RedisError:
            await asyncio.sleep(PASS_S)

    async def run_pass(self) -> None:
        redis = self.ctx.jobs.redis
        batches = [b for b in [await records.load(redis, i) for i in await records.active(redis)] if b]
        self.metrics.count(Counter(b.status for b in batches))
        self._cancelled &= {b.id for b in batches}  # ended batches are forgotten
        self._backoff = {b.id: self._backoff[b.id] for b in batches if b.id in self._backoff}
        self.collector.keep({b.id for b in batches})
        feedable: list[BatchRecord] = []
        for rec in batches:
            if self._backoff.get(rec.id, (0.0, 0.0))[0] > time.monotonic():
                continue
            if await self._guarded(rec, self._step(rec, int(time.time()))):
                feedable.append(rec)
        await self._feed(batches, feedable)

    async def _guarded(self, rec: BatchRecord, step: Awaitable[T]) -> T | None:
        """One batch's step or feed: its trouble never holds the others up."""
        try:
            got = await step
            self._backoff.pop(rec.id, None)
            return got
        except FileNotFoundError:  # its input file is gone
            await self._fail(rec, "file_not_found", "the input file was deleted", int(time.time()))
        except (RedisError, state.LeaseLost):
            raise
        except Exception as exc:
            delay = min(BACKOFF_MAX_S, 2 * self._backoff.get(rec.id, (0.0, BACKOFF_S / 2))[1])
            self._backoff[rec.id] = (time.monotonic() + delay, delay)
            log.warning("batch %s: %s: %s (skipped for %gs)", rec.id, type(exc).__name__, exc, delay)
        return None

    async def _step(self, rec: BatchRecord, now: int) -> bool:
        """One pass over one batch; True when it has lines to feed."""
        redis = self.ctx.jobs.redis
        fence = self.lease.fence
        if rec.status in ("validating", "in_progress") and now >= rec.expires_at:
            await self.collector.collect(fence, rec)  # what finished is written, the rest expires
            await self._cancel_running(rec)
            await finalize(self.ctx, fence, rec, "expired", "validating", "in_progress")
        elif rec.status == "validating":
            await self._validate(rec, now)
        elif rec.status == "in_progress":
            await self.collector.collect(fence, rec)
            if not rec.fed_all:
                return True
            idle = not await redis.hlen(keys.batch_running(rec.id))
            if idle and await state.transition(fence, rec.id, "finalizing", now, "in_progress"):
                await finalize(self.ctx, fence, rec, "completed", "finalizing")
        elif rec.status == "finalizing":  # a runner died finalizing it
            await finalize(self.ctx, fence, rec, "completed", "finalizing")
        elif rec.status == "cancelling":
            await self._cancel_running(rec)
            await self.collector.collect(fence, rec)
            left = await redis.hlen(keys.batch_running(rec.id))
            if not left or now - rec.cancelling_at >= CANCEL_GRACE_S:
                await finalize(self.ctx, fence, rec, "cancelled", "cancelling")
        elif rec.ended:  # ended, but still listed (a crash between the two writes)
            await state.ended(fence, rec)
        return False

    async def _fail(self, rec: BatchRecord, code: str, message: str, now: int) -> None:
        """The batch fails alone: what finished is in its files (the lines not yet collected,
        whose input is gone, are not), its parts removed, its running jobs cancelled."""
        error = {"code": code, "message": message, "param": "input_file_id", "line": None}
        await self._cancel_running(rec)
        from_: tuple[Status, ...] = ("validating", "in_progress", "finalizing", "cancelling")
        await finalize(self.ctx, self.lease.fence, rec, "failed", *from_, errors=[error])

    async def _validate(self, rec: BatchRecord, now: int) -> None:
        fence = self.lease.fence
        total, errors = await asyncio.to_thread(validate, self.ctx.files, rec.input_file_id)
        if errors:
            await state.update(fence, rec.id, errors=json.dumps(errors), total=total)
            if await state.transition(fence, rec.id, "failed", now, "validating"):
                await state.ended(fence, rec)
            return
        await state.update(fence, rec.id, total=total)
        await state.transition(fence, rec.id, "in_progress", now, "validating")

    async def _cancel_running(self, rec: BatchRecord) -> None:
        if rec.id in self._cancelled:
            return
        for text in (await state.running(self.ctx.jobs.redis, rec.id)).values():
            for job_id in Running.from_json(text).jobs:
                await self.ctx.jobs.cancel(job_id)
        self._cancelled.add(rec.id)

    async def _feed(self, batches: list[BatchRecord], feedable: list[BatchRecord]) -> None:
        """Free seats (jobs: a line with n choices of k prompts takes n x k) shared by tenant
        weight (the tenant with the fewest running jobs per unit of weight next), a tenant's share
        to its oldest batch first. Every batch's running jobs count against the window, fed in full
        or not."""
        if not feedable:
            return
        redis = self.ctx.jobs.redis
        pipe = redis.pipeline(transaction=False)
        for rec in batches:
            pipe.hvals(keys.batch_running(rec.id))
        replies = await pipe.execute()
        lines: dict[str, list[Running]] = {}
        for rec, texts in zip(batches, replies, strict=True):
            try:
                lines[rec.id] = [Running.from_json(text) for text in texts]
            except (ValueError, KeyError, TypeError):  # its own step fails and backs it off
                lines[rec.id] = []
                feedable = [r for r in feedable if r.id != rec.id]
        running = {batch: sum(len(line.jobs) for line in held) for batch, held in lines.items()}
        ends = (keys.job_end(job) for held in lines.values() for line in held for job in line.jobs)
        self._watch = list(itertools.islice(ends, WATCH_JOBS))
        free = await seats(self.ctx, sum(running.values()))
        placed = ((line.worker, len(line.jobs)) for held in lines.values() for line in held)
        room = Room.of(free.window, free.workers, placed)
        load: dict[str, int] = {}
        for rec in feedable:
            load[rec.tenant] = load.get(rec.tenant, 0) + running[rec.id]
        weights = {t: self.ctx.keys.weight(t) for t in load}
        share = shares(load, weights, free.free)
        for rec in feedable:  # oldest first (the active list is by created_at)
            if share[rec.tenant] > 0:
                fed = feed(
                    self.ctx, self.lease.fence, rec, self.parts, share[rec.tenant], room, running[rec.id]
                )
                share[rec.tenant] -= await self._guarded(rec, fed) or 0
