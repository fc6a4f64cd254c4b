"""A file's metadata in the queue Redis: hash `file_record(id)`, its tenant's ZSET
`tenant_files(tenant)` (score: when saved) and its size in the tenant's `tenant_file_sizes` (for
the quotas, api/files/quota.py). Contents live in the file store (store.py).

A file with an `expires_at` is gone at that time: its record carries it as its Redis TTL (and
reads as absent from then, whatever Redis's expiry lag), it leaves its tenant's lists at the
tenant's next save, and the sweeper (sweeper.py) removes its contents.

A file belongs to its tenant: `get` and `delete` of another tenant's id answer as if there were no
such file, so the routes give 404 whoever asks."""

from __future__ import annotations

import builtins
import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Literal

from redis.asyncio import Redis
from redis.exceptions import WatchError

from api.lua import Script, affixes
from broker import keys

__all__ = ["PURPOSES", "FileInUse", "FileRecord", "Quota", "delete", "get", "list_files", "save"]

# What a client may upload ("batch_output" is what the batch runner writes).
PURPOSES = ("batch", "user_data")
Order = Literal["asc", "desc"]
Quota = Literal["files", "bytes"]  # which of a tenant's quotas a save would pass
_SAVE = Script(__file__, "save")


@dataclass(slots=True)
class FileRecord:
    id: str
    tenant: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: str = "processed"
    lines: int = 0  # non-empty lines (counted for purpose "batch"; 0 otherwise)
    expires_at: int = 0  # unix seconds; 0: kept until deleted

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's FileObject."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": self.status,
            "expires_at": self.expires_at or None,
            "status_details": None,
        }

    def to_hash(self) -> dict[str, str]:
        return {f.name: str(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_hash(cls, raw: dict[builtins.bytes, builtins.bytes]) -> FileRecord:
        got = {k.decode(): v.decode() for k, v in raw.items()}
        return cls(
            id=got["id"],
            tenant=got["tenant"],
            bytes=int(got["bytes"]),
            created_at=int(got["created_at"]),
            filename=got["filename"],
            purpose=got["purpose"],
            status=got.get("status", "processed"),
            lines=int(got.get("lines", "0")),
            expires_at=int(got.get("expires_at", "0")),
        )

    def expired(self, now: float) -> bool:
        return 0 < self.expires_at <= now


async def save(
    redis: Redis, rec: FileRecord, max_files: int = 0, max_bytes: int = 0, write: bool = True
) -> Quota | None:
    """Write (or overwrite) the record and list it under its tenant, atomically, unless the
    tenant's files would then number more than `max_files` or hold more than `max_bytes` (0: no
    cap): then nothing is written and the quota it would pass is returned. write=False: only
    that check (before an upload is read)."""
    tenant = rec.tenant
    record_keys = (keys.file_record(rec.id), keys.tenant_files(tenant), keys.tenant_file_sizes(tenant))
    # Scored by when it was saved, to the microsecond: files made within one second still list in order.
    args: list[Any] = [rec.id, time.time(), rec.bytes, max_files, max_bytes, rec.expires_at]
    args += [*affixes(keys.file_record), "1" if write else "0"]
    args.extend(x for pair in rec.to_hash().items() for x in pair)
    passed: Any = await _SAVE(redis, record_keys, args)
    return None if not passed else ("files" if passed == b"files" else "bytes")


async def get(redis: Redis, tenant: str, file_id: str) -> FileRecord | None:
    """The tenant's file, None when there is none (or it is another tenant's)."""
    raw: Any = await redis.hgetall(keys.file_record(file_id))
    if not raw:
        return None
    rec = FileRecord.from_hash(raw)
    return rec if rec.tenant == tenant and not rec.expired(time.time()) else None


class FileInUse(Exception):
    """A batch not yet ended reads the file (keys.file_readers)."""


async def delete(redis: Redis, tenant: str, file_id: str) -> bool:
    """Forget the tenant's file; False when it has none of that id; FileInUse while a batch reads
    it (checked atomically with the delete: a batch created meanwhile is seen). The caller removes
    the contents."""
    if await get(redis, tenant, file_id) is None:
        return False
    readers = keys.file_readers(file_id)
    async with redis.pipeline(transaction=True) as pipe:
        while True:
            try:
                await pipe.watch(readers)
                if await pipe.scard(readers):
                    raise FileInUse(file_id)
                pipe.multi()
                pipe.delete(keys.file_record(file_id))
                pipe.zrem(keys.tenant_files(tenant), file_id)
                pipe.hdel(keys.tenant_file_sizes(tenant), file_id)
                await pipe.execute()
                return True
            except WatchError:
                continue


async def list_files(
    redis: Redis,
    tenant: str,
    purpose: str | None = None,
    after: str | None = None,
    limit: int = 10000,
    order: Order = "desc",
) -> tuple[list[FileRecord], bool]:
    """The tenant's files by created_at (`after`: a file id, the page starts past it), at most
    `limit` of them, `purpose` ones only when given; and whether more follow."""
    zset = keys.tenant_files(tenant)
    start = 0
    if after is not None:
        rank: Any = await (redis.zrevrank(zset, after) if order == "desc" else redis.zrank(zset, after))
        if rank is None:
            return [], False
        start = int(rank) + 1
    found: list[FileRecord] = []
    page = max(limit + 1, 100)
    while len(found) <= limit:
        ids: Any = await redis.zrange(zset, start, start + page - 1, desc=order == "desc")
        if not ids:
            break
        start += len(ids)
        pipe = redis.pipeline(transaction=False)
        for file_id in ids:
            pipe.hgetall(keys.file_record(file_id.decode()))
        now = time.time()
        for raw in await pipe.execute():
            if raw:  # a record deleted (or expired) between the two reads is skipped
                rec = FileRecord.from_hash(raw)
                if rec.tenant == tenant and not rec.expired(now) and purpose in (None, rec.purpose):
                    found.append(rec)
    return found[:limit], len(found) > limit
