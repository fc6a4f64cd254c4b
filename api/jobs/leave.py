"""A cancelled job leaves fair dispatch's sets at once (api/dispatch/): out of the parked jobs (its
release record goes, so the dispatcher never queues it) and out of the released ones (keys.INFLIGHT
and its tenant's share), so it holds no seat of the window while its worker stops."""

from __future__ import annotations

import redis.asyncio as aioredis

from broker import keys

HOLE = "\x01"  # where a key template takes its tenant (no tenant name holds it: api/tenants.py)

# KEYS: PARKED, INFLIGHT, the job's parked hash, its metadata; ARGV: job id, the tenant's parked
# and released key templates (HOLE for the tenant).
LEAVE = """
local function key(tpl, x)
  local i = string.find(tpl, ARGV[4], 1, true)
  return string.sub(tpl, 1, i - 1) .. x .. string.sub(tpl, i + 1)
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
local parked = redis.call('HGET', KEYS[3], 'tenant')
if parked then
  redis.call('ZREM', key(ARGV[2], parked), ARGV[1])
  redis.call('DEL', KEYS[3])
end
local tenant = redis.call('HGET', KEYS[4], 'tenant')
if tenant then redis.call('ZREM', key(ARGV[3], tenant), ARGV[1]) end
return 1
"""


async def leave(client: aioredis.Redis, job_id: str) -> None:
    script = client.register_script(LEAVE)
    await script(
        keys=[keys.PARKED, keys.INFLIGHT, keys.job_parked(job_id), keys.job_meta(job_id)],
        args=[job_id, keys.tenant_parked(HOLE), keys.tenant_inflight(HOLE), HOLE],
    )
