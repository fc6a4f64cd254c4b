"""A cancelled job leaves fair dispatch's sets at once (api/dispatch/): out of the parked jobs (its
release record goes, so the dispatcher never queues it) and out of the released ones (keys.INFLIGHT
and its tenant's share), so it holds no seat of the window while its worker stops."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from api.lua import Script
from broker import keys

HOLE = "\x01"  # where a key template takes its tenant (no tenant name holds it: api/tenants.py)

_LEAVE = Script(__file__, "leave")


@dataclass(frozen=True, slots=True)
class Leave:
    """KEYS and ARGV of lua/leave.lua: a cancelled job out of the parked and the released jobs."""

    job_id: str

    def keys(self) -> list[str]:
        return [keys.PARKED, keys.INFLIGHT, keys.job_parked(self.job_id), keys.job_meta(self.job_id)]

    def args(self) -> list[Any]:
        return [self.job_id, keys.tenant_parked(HOLE), keys.tenant_inflight(HOLE), HOLE]


async def leave(client: aioredis.Redis, job_id: str) -> None:
    await _LEAVE.run(client, Leave(job_id))
