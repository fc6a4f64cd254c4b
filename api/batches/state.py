"""A batch's changes in Redis, each one atomic (a script), so that a runner that dies between two
of them, or a second runner that briefly overlaps a lapsed one, never counts a line twice:

- transition: status `to` (and its `<to>_at` time) only from one of the statuses given;
- feed: the line's jobs recorded as running and the cursor moved past it, only if the cursor is
  still where the runner read it (compare and set);
- skip: a bad line (already in the error part) counted failed, the cursor moved past it, likewise;
- done: a running line written to its part: it leaves the running hash and is counted, once."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from api.batches import retention
from api.batches.records import Status
from broker import keys

_TRANSITION = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return 0 end
for i = 4, #ARGV do
  if ARGV[i] == status then
    redis.call('HSET', KEYS[1], 'status', ARGV[1], ARGV[2], ARGV[3])
    return 1
  end
end
return 0
"""
_FEED = """
if redis.call('HGET', KEYS[1], 'cursor_line') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'cursor_line', ARGV[2], 'cursor_offset', ARGV[3])
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[2], ARGV[5], ARGV[4])
else
  redis.call('HINCRBY', KEYS[1], 'failed', 1)
end
return 1
"""
_DONE = """
if redis.call('HDEL', KEYS[2], ARGV[1]) == 1 then
  redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
  return 1
end
return 0
"""


async def transition(redis: Redis, batch_id: str, to: Status, now: int, *from_: Status) -> bool:
    changed: Any = await redis.eval(_TRANSITION, 1, keys.batch_record(batch_id), to, f"{to}_at", now, *from_)
    return bool(changed)


async def feed(
    redis: Redis, batch_id: str, cursor: int, line_no: int, next_line: int, next_offset: int, running: str
) -> bool:
    """Line `line_no`, read from the cursor at line `cursor` (blank lines may lie between): its
    jobs (`running`, JSON) recorded, or "" for a bad line, counted failed instead."""
    args = (cursor, next_line, next_offset, running, line_no)
    moved: Any = await redis.eval(_FEED, 2, keys.batch_record(batch_id), keys.batch_running(batch_id), *args)
    return bool(moved)


async def done(redis: Redis, batch_id: str, line_no: int, outcome: str) -> bool:
    """outcome: "completed" or "failed"; False if the line was already done (counted once)."""
    args = (keys.batch_record(batch_id), keys.batch_running(batch_id), line_no, outcome)
    counted: Any = await redis.eval(_DONE, 2, *args)
    return bool(counted)


async def update(redis: Redis, batch_id: str, **values: str | int) -> None:
    mapping: dict[str | bytes, str | bytes | int | float] = {k: str(v) for k, v in values.items()}
    await redis.hset(keys.batch_record(batch_id), mapping=mapping)  # type: ignore[arg-type,unused-ignore]


async def running(redis: Redis, batch_id: str) -> dict[int, str]:
    raw: Any = await redis.hgetall(keys.batch_running(batch_id))
    return {int(k): v.decode() for k, v in raw.items()}


async def ended(redis: Redis, batch_id: str) -> None:
    """Out of the runner's list; its running hash is gone (nothing runs for it any more); its
    record kept for its retention."""
    pipe = redis.pipeline(transaction=True)
    pipe.zrem(keys.BATCHES_ACTIVE, batch_id)
    pipe.delete(keys.batch_running(batch_id))
    await pipe.execute()
    await retention.retain(redis, batch_id)
