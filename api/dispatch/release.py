"""The release script: queues parked jobs while the window has room, the tenant with the fewest
released jobs per unit of weight first (ties: the lowest band, then the first parked), and writes
for each what the direct path writes (pending entry, delivery records, the message at its band's
list), all in one atomic run, fenced by the dispatcher's lease token.

A parked job whose message copy is gone (cancelled, expired) or whose cancel flag is set is
dropped, not queued. Its delivery record's time is the release, not the submission: the
lost-message check infers "popped" from later jobs of the same list (broker/jobs/delivery.py),
and a parked job is pushed after jobs submitted later than it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from api.jobs.leave import HOLE
from api.lua import Script
from broker import keys

MAX_PER_RUN = 64  # jobs one run releases at most: a script never holds Redis long

_RELEASE = Script(__file__, "release")

_TEMPLATES = (
    keys.tenant_inflight(HOLE),
    keys.tenant_parked(HOLE),
    keys.job_parked(HOLE),
    keys.job_message(HOLE),
    keys.job_cancel(HOLE),
    keys.job_delivery(HOLE),
    keys.message_job(HOLE),
)


@dataclass(frozen=True, slots=True)
class Released:
    fenced: bool  # the token was not the lease's: nothing ran
    released: int
    parked: int  # parked jobs left


@dataclass(frozen=True, slots=True)
class Release:
    """KEYS and ARGV of lua/release.lua: one run of the dispatcher, fenced by its lease token."""

    token: str
    now: float
    window: int
    weights: dict[str, float]
    limit: int = MAX_PER_RUN

    def keys(self) -> list[str]:
        return [keys.DISPATCH_LEASE, keys.INFLIGHT, keys.PARKED, keys.PARKED_TENANTS, keys.PENDING_JOBS]

    def args(self) -> list[Any]:
        pairs = [x for tenant, weight in self.weights.items() for x in (tenant, repr(float(weight)))]
        return [self.token, repr(self.now), self.window, self.limit, HOLE, *_TEMPLATES, *pairs]


class ReleaseScript:
    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client

    async def run(
        self, token: str, now: float, window: int, weights: dict[str, float], limit: int = MAX_PER_RUN
    ) -> Released:
        reply: Any = await _RELEASE.run(self.client, Release(token, now, window, weights, limit))
        released, parked = int(reply[0]), int(reply[1])
        return Released(released < 0, max(0, released), parked)
