"""How long a batch and its files live (docs/api.md#retention): an ended batch's record expires
KVFERRY_BATCH_RETENTION_S after it ended (a Redis TTL set as it ends: `retain`); its output and
error files expire as its `output_expires_after` says, else KVFERRY_BATCH_OUTPUT_EXPIRY_S after
they are written. Both times are in the batch's record from its creation, so whoever ends it
needs no settings."""

from __future__ import annotations

from redis.asyncio import Redis

from api.batches.records import BatchRecord
from api.lua import Script
from broker import keys

__all__ = ["output_expires_at", "retain"]

_RETAIN = Script(__file__, "retain")


async def retain(redis: Redis, batch_id: str) -> None:
    """The ended batch's record gets its TTL."""
    await _RETAIN(redis, (keys.batch_record(batch_id),), ())


def output_expires_at(rec: BatchRecord, now: int) -> int:
    """When the batch's output and error files, written at `now`, expire; 0: never."""
    return now + rec.output_expires_s if rec.output_expires_s > 0 else 0
