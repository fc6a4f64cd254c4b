"""A tenant's cap on batches not yet ended (KVFERRY_TENANT_MAX_BATCHES): a new batch past it is a
429 naming the limit. The count is one script (lua/open.lua), so two creates racing cannot both
pass; an ended batch leaves the count at the tenant's next create."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from api.batches.records import ENDED
from api.files.quota import over_quota
from api.lua import Script, affixes
from broker import keys

__all__ = ["admit"]

_OPEN = Script(__file__, "open")


async def admit(redis: Redis, tenant: str, batch_id: str, now: int, max_open: int) -> None:
    """Count the new batch among the tenant's open ones, or 429 when it has `max_open` (0: no cap)."""
    args = (batch_id, now, max_open, *affixes(keys.batch_record), *ENDED)
    open_before: Any = await _OPEN(redis, (keys.tenant_open_batches(tenant),), args)
    if int(open_before) < 0:
        message = (
            f"batch quota reached: a tenant may have at most {max_open} batches not yet ended "
            "(KVFERRY_TENANT_MAX_BATCHES)"
        )
        raise over_quota(message, "tenant_batch_limit")
