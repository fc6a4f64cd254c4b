"""Who holds which prompt prefix, for cache-aware routing: a reverse index, digest -> workers.

keys.prefix_holders(digest) is a ZSET worker -> when it last served that prefix, trimmed to the
MAX_HOLDERS most recent and expiring PREFIXES_TTL_S after its last write. A worker advertises the
digests of what it served (workers/sessions/keeper.py); the router (api/routing/router.py) reads one key
per digest of the request, never one per worker: a route lookup costs the same at 2 workers as at
64, whatever each worker has cached.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio as aioredis

from broker import keys

MAX_HOLDERS = 16  # the most recent holders a digest keeps: more would only tie on the prefix
PREFIXES_TTL_S = 86400  # a prefix nobody served for a day is forgotten


def advertise(pipe: redis.client.Pipeline, worker: str, digests: Sequence[str], now: float) -> None:
    """Queue on `pipe` that `worker` served these digests at `now`."""
    for digest in digests:
        key = keys.prefix_holders(digest)
        pipe.zadd(key, {worker: now})
        pipe.zremrangebyrank(key, 0, -MAX_HOLDERS - 1)
        pipe.expire(key, PREFIXES_TTL_S)


def runs(holders: Sequence[Any], candidates: Sequence[str]) -> dict[str, int]:
    """For each candidate worker, how many of the request's digests it holds from the first on
    (`holders`: each digest's ZRANGE reply, in the request's order)."""
    held = [{h.decode() if isinstance(h, bytes) else h for h in reply or ()} for reply in holders]
    out = {}
    for name in candidates:
        run = 0
        for names in held:
            if name not in names:
                break
            run += 1
        out[name] = run
    return out


async def matches(
    client: aioredis.Redis, candidates: Sequence[str], digests: Sequence[str]
) -> dict[str, int]:
    """runs() read in one round trip: one ZRANGE per digest of the request."""
    pipe = client.pipeline(transaction=False)
    for digest in digests:
        pipe.zrange(keys.prefix_holders(digest), 0, -1)
    return runs(await pipe.execute(), candidates)
