"""How long a batch and its files live (docs/files.md#retention): an ended batch's record expires
KVFERRY_BATCH_RETENTION_S after it ended (a Redis TTL set by the script that ends it: lua/ended.lua,
lua/finish.lua); its output and error files expire as its `output_expires_after` says, else
KVFERRY_BATCH_OUTPUT_EXPIRY_S after they are written. Both times are in the batch's record from its
creation, so whoever ends it needs no settings."""

from __future__ import annotations

from api.batches.records import BatchRecord

__all__ = ["output_expires_at"]


def output_expires_at(rec: BatchRecord, now: int) -> int:
    """When the batch's output and error files, written at `now`, expire; 0: never."""
    return now + rec.output_expires_s if rec.output_expires_s > 0 else 0
