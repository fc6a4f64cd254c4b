"""A batch's record in the queue Redis: hash `keys.batch_record(id)` (OpenAI's Batch fields, its
tenant, its live counts and the runner's cursor into its input file), listed under its tenant
(`keys.tenant_batches`, by created_at) and, until it ends, in `keys.BATCHES_ACTIVE` and among
its input file's readers (`keys.file_readers`: the file cannot be deleted meanwhile).

Another tenant's batch answers as if there were none: the routes give 404 whoever asks."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from redis.asyncio import Redis

from broker import keys

Status = Literal[
    "validating", "in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled"
]
ENDED: tuple[Status, ...] = ("completed", "failed", "expired", "cancelled")
_TIMES = (
    "in_progress_at",
    "expires_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)


def new_batch_id() -> str:
    return f"batch_{uuid.uuid4().hex}"


@dataclass(slots=True)
class BatchRecord:
    id: str
    tenant: str
    endpoint: str
    input_file_id: str
    created_at: int
    expires_at: int
    status: Status = "validating"
    completion_window: str = "24h"
    metadata: dict[str, str] | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)  # why it failed validation
    output_file_id: str = ""
    error_file_id: str = ""
    in_progress_at: int = 0
    finalizing_at: int = 0
    completed_at: int = 0
    failed_at: int = 0
    expired_at: int = 0
    cancelling_at: int = 0
    cancelled_at: int = 0
    total: int = 0
    completed: int = 0
    failed: int = 0
    # the runner's place in the input file: the next line to feed, and its byte offset
    cursor_line: int = 1
    cursor_offset: int = 0
    fed_all: bool = False  # every line fed (or written as an error)
    # retention (api/batches/retention.py), fixed at creation: 0 = kept
    retain_s: int = 0  # the record, once ended
    output_expires_s: int = 0  # the output and error files, once written

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's Batch object."""
        body: dict[str, Any] = {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": {"object": "list", "data": self.errors} if self.errors else None,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status,
            "output_file_id": self.output_file_id or None,
            "error_file_id": self.error_file_id or None,
            "created_at": self.created_at,
        }
        body.update({name: getattr(self, name) or None for name in _TIMES})
        body["request_counts"] = {"total": self.total, "completed": self.completed, "failed": self.failed}
        body["metadata"] = self.metadata
        return body

    def to_hash(self) -> dict[str, str]:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("metadata", "errors"):
                out[f.name] = json.dumps(value)
            elif isinstance(value, bool):
                out[f.name] = "1" if value else ""
            else:
                out[f.name] = str(value)
        return out

    @classmethod
    def from_hash(cls, raw: dict[bytes, bytes]) -> BatchRecord:
        got = {k.decode(): v.decode() for k, v in raw.items()}
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in got:
                continue
            text = got[f.name]
            if f.name in ("metadata", "errors"):
                values[f.name] = json.loads(text)
            elif f.name == "fed_all":
                values[f.name] = bool(text)
            elif f.type == "int":
                values[f.name] = int(text)
            else:
                values[f.name] = text
        return cls(**values)

    @property
    def ended(self) -> bool:
        return self.status in ENDED


async def create(redis: Redis, rec: BatchRecord) -> None:
    pipe = redis.pipeline(transaction=True)
    pipe.hset(keys.batch_record(rec.id), mapping=rec.to_hash())  # type: ignore[arg-type]
    pipe.zadd(keys.tenant_batches(rec.tenant), {rec.id: rec.created_at})
    pipe.zadd(keys.BATCHES_ACTIVE, {rec.id: rec.created_at})
    pipe.sadd(keys.file_readers(rec.input_file_id), rec.id)  # its input cannot be deleted until it ends
    await pipe.execute()


async def load(redis: Redis, batch_id: str) -> BatchRecord | None:
    raw: Any = await redis.hgetall(keys.batch_record(batch_id))
    return BatchRecord.from_hash(raw) if raw else None


async def get(redis: Redis, tenant: str, batch_id: str) -> BatchRecord | None:
    """The tenant's batch; None when there is none (or it is another tenant's)."""
    rec = await load(redis, batch_id)
    return rec if rec is not None and rec.tenant == tenant else None


async def list_batches(
    redis: Redis, tenant: str, after: str | None, limit: int
) -> tuple[list[BatchRecord], bool]:
    """The tenant's batches, newest first, starting past `after`; and whether more follow."""
    zset = keys.tenant_batches(tenant)
    start = 0
    if after is not None:
        rank: Any = await redis.zrevrank(zset, after)
        if rank is None:
            return [], False
        start = int(rank) + 1
    ids: Any = await redis.zrange(zset, start, start + limit, desc=True)
    pipe = redis.pipeline(transaction=False)
    for batch_id in ids[:limit]:
        pipe.hgetall(keys.batch_record(batch_id.decode()))
    raws = await pipe.execute()
    gone = [batch_id for batch_id, raw in zip(ids, raws, strict=False) if not raw]
    if gone:  # past their retention (api/batches/retention.py): out of the tenant's list too
        await redis.zrem(zset, *gone)
    found = [BatchRecord.from_hash(raw) for raw in raws if raw]
    return found, len(ids) > limit


async def active(redis: Redis) -> list[str]:
    """Every batch not yet ended, oldest first."""
    ids: Any = await redis.zrange(keys.BATCHES_ACTIVE, 0, -1)
    return [i.decode() for i in ids]


async def readers(redis: Redis, file_id: str) -> list[str]:
    """The batches not yet ended that read this file; a reader whose record is gone or ended (a
    crash between its end and this list's update) is dropped from the list."""
    ids: Any = await redis.smembers(keys.file_readers(file_id))
    live = []
    for raw in ids:
        batch_id = raw.decode()
        rec = await load(redis, batch_id)
        if rec is None or rec.ended:
            await redis.srem(keys.file_readers(file_id), batch_id)
        else:
            live.append(batch_id)
    return sorted(live)
