"""A tenant's unfinished jobs: the ZSET `keys.tenant_jobs(tenant)` (job id -> deadline), the
per-tenant job cap (ApiConfig.tenant_max_jobs) and the once-per-job accounting of finished jobs.

A job id is added when the api queues the job and removed when its final event is seen (by the
worker that publishes it, by the api that reads it, on cancel). An entry whose deadline passed is
pruned before every check, so a job nobody saw finish stops counting by itself."""

from __future__ import annotations

import time
from typing import Any

import redis.asyncio as aioredis

from broker import keys
from broker.jobs.message_copy import copy_keys, forget_lua

# KEYS[1] the tenant's ZSET; ARGV: now, deadline, job id, cap (0: none). 1 admitted, 0 full.
_ADMIT = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local cap = tonumber(ARGV[4])
if cap > 0 and redis.call('ZCARD', KEYS[1]) >= cap then return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
local last = redis.call('ZREVRANGE', KEYS[1], 0, 0, 'WITHSCORES')
redis.call('EXPIREAT', KEYS[1], math.ceil(tonumber(last[2])) + 1)
return 1
"""

# KEYS[1] the tenant's ZSET, KEYS[2] the job's metadata hash, KEYS[3:4] the queued message's copy
# (its prompt goes: broker/jobs/message_copy.py), KEYS[5:6] keys.INFLIGHT and the tenant's released
# jobs (its seat in the dispatch window is free: api/dispatch/); ARGV[1] job id.
# 1 the first time a job's end is seen (its tokens are counted then), else 0. The metadata's
# TTL is untouched: HSETNX only on a hash that exists.
_FINISH = f"""
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1])
{forget_lua(3, 1)}
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
return redis.call('HSETNX', KEYS[2], 'accounted', '1')
"""


async def admit(client: aioredis.Redis, tenant: str, job_id: str, deadline: float, cap: int) -> bool:
    reply: Any = await client.register_script(_ADMIT)(
        keys=[keys.tenant_jobs(tenant)], args=[repr(time.time()), repr(deadline), job_id, str(cap)]
    )
    return bool(int(reply))


async def release(client: aioredis.Redis, tenant: str, job_id: str) -> None:
    await client.zrem(keys.tenant_jobs(tenant), job_id)


async def finish(client: aioredis.Redis, tenant: str, job_id: str) -> bool:
    """The job is over: it stops counting against its tenant; True the first time only."""
    reply: Any = await client.register_script(_FINISH)(
        keys=[
            keys.tenant_jobs(tenant),
            keys.job_meta(job_id),
            *copy_keys(job_id),
            keys.INFLIGHT,
            keys.tenant_inflight(tenant),
        ],
        args=[job_id],
    )
    return bool(int(reply))


async def running(client: aioredis.Redis, tenants: list[str]) -> dict[str, int]:
    """Unfinished jobs per tenant (entries past their deadline not counted)."""
    now = time.time()
    pipe = client.pipeline(transaction=False)
    for tenant in tenants:
        pipe.zcount(keys.tenant_jobs(tenant), f"({now}", "+inf")
    replies: list[Any] = await pipe.execute()
    return {t: int(n) for t, n in zip(tenants, replies, strict=True)}
