"""The dispatcher: one elected api (api/dispatch/lease.py) releases parked jobs in weighted fair
order while the window has room (api/dispatch/release.py). Every api runs the loop; only the
lease's holder releases, the others try to take the lease now and then.

The holder runs the release script every short period while jobs are parked, and sooner when
this api sees a job end or parks one (JobClient.wake); a job that ends elsewhere is noticed within
the period. While nothing is parked every api only looks (one read a period) and nobody holds the
lease: the first api to see a parked job takes it. Everything lives in Redis, so an api restart or
a change of holder loses nothing. With no window known (no live worker says its concurrency)
every parked job is released: the same rule as admission's, where every job then goes straight
to its queue."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from redis.exceptions import RedisError

from api.background import STOP_WAIT_S, FailureLog, stop_tasks
from api.dispatch.lease import DispatchLease, api_name
from api.dispatch.release import Released, ReleaseScript
from api.jobs.admission import window_of
from api.jobs.client import JobClient
from broker import keys

log = logging.getLogger(__name__)
BUSY_PERIOD_S = 0.05  # while jobs are parked
IDLE_PERIOD_S = 0.25  # the holder, none parked
FOLLOWER_PERIOD_S = 1.0  # an api without the lease tries to take it this often
LEASE_TTL_S = 5.0
RENEW_EVERY_S = 1.0
UNLIMITED = 1 << 30  # the window when none is known
IDLE = Released(fenced=False, released=0, parked=0)


class Dispatcher:
    def __init__(
        self, jobs: JobClient, headroom: int, weights: Callable[[], dict[str, float]], name: str | None = None
    ) -> None:
        self.jobs = jobs
        self.headroom = headroom
        self.weights = weights
        self.lease = DispatchLease(jobs.redis, name or api_name(), LEASE_TTL_S)
        self._release = ReleaseScript(jobs.redis)
        self._renewed = -1e9
        self._task: asyncio.Task[None] | None = None
        self.failures = FailureLog("dispatcher", log)

    async def window(self) -> int:
        seats = window_of(await self.jobs.fleet.workers(self.jobs.redis), self.headroom)
        return seats or UNLIMITED

    async def pass_once(self) -> Released | None:
        """One pass: with jobs parked, hold the lease (renewed at most every RENEW_EVERY_S), then
        release. None when another api holds it. With none parked it only looks (one read, no
        write: the lease lapses while there is nothing to release)."""
        if not await self.jobs.redis.exists(keys.PARKED):
            return IDLE
        now = time.monotonic()
        if not self.lease.held or now - self._renewed >= RENEW_EVERY_S:
            if not await self.lease.hold():
                return None
            self._renewed = now
        out = await self._release.run(self.lease.token, time.time(), await self.window(), self.weights())
        if out.fenced:  # the lease lapsed under us: take it again next pass
            self.lease.held = False
        return out

    async def run(self) -> None:
        while True:
            try:
                out = await self.pass_once()
                self.failures.passed()
            except (RedisError, OSError) as exc:
                self.failures.failed(exc)
                out = None
            except Exception as exc:  # a bug: logged, counted (/metrics), and the loop goes on
                self.failures.failed(exc, expected=False)
                out = None  # the next pass a follower's period later: a backoff, not a spin
            period = FOLLOWER_PERIOD_S if out is None else BUSY_PERIOD_S if out.parked else IDLE_PERIOD_S
            self.jobs.wake.clear()
            # asyncio.timeout, not wait_for: Python 3.11's wait_for may swallow a cancel that
            # arrives as the wait ends, and the api's shutdown would then wait on this loop forever
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(period):
                    await self.jobs.wake.wait()

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="kvferry-dispatcher")

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._task

    async def stop(self) -> None:
        """Stop the loop (if the app has not stopped it with others: api/app.py) and give the lease
        back, a bounded while: with Redis down it lapses by itself."""
        if self._task is not None:
            await stop_tasks(self._task)
            self._task = None
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            async with asyncio.timeout(STOP_WAIT_S):
                await self.lease.release()
