"""A tenant's unfinished jobs: the ZSET `keys.tenant_jobs(tenant)` (job id -> deadline), the
per-tenant job cap (ApiConfig.tenant_max_jobs) and the once-per-job accounting of finished jobs.

A job id is added when the api queues the job and removed when its final event is seen (by the
worker that publishes it, by the api that reads it, on cancel). An entry whose deadline passed is
pruned before every check, so a job nobody saw finish stops counting by itself."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from api.lua import Script
from broker import keys
from broker.jobs.message_copy import FORGET_COPY, copy_keys

_ADMIT = Script(__file__, "admit")
_FINISH = Script(__file__, "finish", (FORGET_COPY,))


@dataclass(frozen=True, slots=True)
class Admit:
    """KEYS and ARGV of lua/admit.lua: a new job against its tenant's cap."""

    tenant: str
    job_id: str
    deadline: float
    cap: int  # 0: none
    now: float

    def keys(self) -> list[str]:
        return [keys.tenant_jobs(self.tenant)]

    def args(self) -> list[Any]:
        return [repr(self.now), repr(self.deadline), self.job_id, str(self.cap)]


@dataclass(frozen=True, slots=True)
class Finish:
    """KEYS and ARGV of lua/finish.lua: a job's end, seen."""

    tenant: str
    job_id: str

    def keys(self) -> list[str]:
        return [
            keys.tenant_jobs(self.tenant),
            keys.job_meta(self.job_id),
            *copy_keys(self.job_id),
            keys.INFLIGHT,
            keys.tenant_inflight(self.tenant),
        ]

    def args(self) -> list[Any]:
        return [self.job_id]


async def admit(client: aioredis.Redis, tenant: str, job_id: str, deadline: float, cap: int) -> bool:
    reply: Any = await _ADMIT.run(client, Admit(tenant, job_id, deadline, cap, time.time()))
    return bool(int(reply))


async def release(client: aioredis.Redis, tenant: str, job_id: str) -> None:
    await client.zrem(keys.tenant_jobs(tenant), job_id)


async def finish(client: aioredis.Redis, tenant: str, job_id: str) -> bool:
    """The job is over: it stops counting against its tenant; True the first time only."""
    reply: Any = await _FINISH.run(client, Finish(tenant, job_id))
    return bool(int(reply))


async def running(client: aioredis.Redis, tenants: list[str]) -> dict[str, int]:
    """Unfinished jobs per tenant (entries past their deadline not counted)."""
    now = time.time()
    pipe = client.pipeline(transaction=False)
    for tenant in tenants:
        pipe.zcount(keys.tenant_jobs(tenant), f"({now}", "+inf")
    replies: list[Any] = await pipe.execute()
    return {t: int(n) for t, n in zip(tenants, replies, strict=True)}
