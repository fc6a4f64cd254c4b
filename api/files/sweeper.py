"""The file sweeper: one api replica at a time (a Redis lease, as the batch runner's) removes from
the file store, every KVFERRY_FILES_SWEEP_INTERVAL_S, what nothing owns any more:

- a file's contents whose record is gone or expired (api/files/records.py: an expired file's
  record is dropped by Redis at its `expires_at`), unless a batch not yet ended reads it;
- a batch's part file (api/batches/parts.py) once the batch is no longer active;
- a temporary file (an upload or a merge cut off by a crash).

Only what is older than KVFERRY_FILES_ORPHAN_GRACE_S goes: an upload's contents are in place a
moment before its record, a batch's output files likewise, and a write in progress keeps its
temporary file's time fresh."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from redis.asyncio import Redis

from api.background import FailureLog
from api.files.store import FileStore, Stored
from broker import keys

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Swept:
    contents: int = 0  # files' contents without a live record
    parts: int = 0  # ended batches' part files
    tmp: int = 0  # temporary files


class Lease(Protocol):
    """One api replica at a time sweeps (api/dispatch/lease.py DispatchLease)."""

    async def hold(self) -> bool: ...

    async def release(self) -> None: ...


@dataclass(frozen=True, slots=True)
class SweepTerms:
    interval_s: float  # KVFERRY_FILES_SWEEP_INTERVAL_S
    grace_s: float  # KVFERRY_FILES_ORPHAN_GRACE_S: what is younger stays


class FileSweeper:
    """`in_use`: the names of the files the batches not yet ended read or write (api/batches/
    parts.py in_use): the store knows nothing of batches, the api wires them in (api/app.py)."""

    def __init__(
        self,
        redis: Redis,
        store: FileStore,
        terms: SweepTerms,
        in_use: Callable[[], Awaitable[set[str]]],
        lease: Lease,
    ) -> None:
        self.redis, self.store, self.terms, self.in_use, self.lease = redis, store, terms, in_use, lease
        self.failures = FailureLog("file sweeper", log)

    async def run(self) -> None:
        while True:
            try:
                if await self.lease.hold():
                    swept = await self.sweep()
                    if swept != Swept():
                        log.info("file sweeper removed %s", swept)
                self.failures.passed()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis down, a disk hiccup: the next pass tries again
                self.failures.failed(exc)
            await asyncio.sleep(self.terms.interval_s)

    async def release(self) -> None:
        await self.lease.release()

    async def sweep(self) -> Swept:
        store = self.store
        now = time.time()
        old_enough = now - self.terms.grace_s
        stale = [e for e in await asyncio.to_thread(store.listing) if e.mtime < old_enough]
        if not stale:
            return Swept()
        in_use = await self.in_use()
        contents = [e for e in stale if not e.tmp and not e.name.endswith(".part") and e.name not in in_use]
        live = await self._live(contents, now)
        gone: list[Stored] = [e for e in contents if e.name not in live]
        parts = [e for e in stale if not e.tmp and e.name.endswith(".part") and e.name not in in_use]
        tmp = [e for e in stale if e.tmp]
        for entry in (*gone, *parts, *tmp):
            await asyncio.to_thread(store.remove, entry)
        return Swept(len(gone), len(parts), len(tmp))

    async def _live(self, contents: list[Stored], now: float) -> set[str]:
        """Those of `contents` whose record exists and has not expired."""
        pipe = self.redis.pipeline(transaction=False)
        for entry in contents:
            pipe.hmget(keys.file_record(entry.name), "id", "expires_at")
        live = set()
        replies: list[Any] = await pipe.execute() if contents else []
        for entry, (found, expires_at) in zip(contents, replies, strict=True):
            if found is not None and not 0 < int(expires_at or 0) <= now:
                live.add(entry.name)
        return live
