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
from dataclasses import dataclass
from typing import Any

from api.background import FailureLog
from api.batches import records as batch_records
from api.batches.parts import error_part, output_part
from api.context import ApiContext
from api.dispatch.lease import DispatchLease, api_name
from api.files.store import Stored
from broker import keys

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Swept:
    contents: int = 0  # files' contents without a live record
    parts: int = 0  # ended batches' part files
    tmp: int = 0  # temporary files


class FileSweeper:
    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        interval = ctx.config.files_sweep_interval_s
        # held across the sleep between passes: it lapses only when its holder stops sweeping
        lease_s = max(3 * interval, 5.0)
        redis = ctx.jobs.redis
        self.lease = DispatchLease(redis, api_name(), lease_s, keys.FILES_SWEEPER_LEASE, "the file sweeper")
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
            await asyncio.sleep(self.ctx.config.files_sweep_interval_s)

    async def release(self) -> None:
        await self.lease.release()

    async def sweep(self) -> Swept:
        store = self.ctx.files
        now = time.time()
        old_enough = now - self.ctx.config.files_orphan_grace_s
        stale = [e for e in await asyncio.to_thread(store.listing) if e.mtime < old_enough]
        if not stale:
            return Swept()
        in_use = await self._in_use()
        contents = [e for e in stale if not e.tmp and not e.name.endswith(".part") and e.name not in in_use]
        live = await self._live(contents, now)
        gone: list[Stored] = [e for e in contents if e.name not in live]
        parts = [e for e in stale if not e.tmp and e.name.endswith(".part") and e.name not in in_use]
        tmp = [e for e in stale if e.tmp]
        for entry in (*gone, *parts, *tmp):
            await asyncio.to_thread(store.remove, entry)
        return Swept(len(gone), len(parts), len(tmp))

    async def _in_use(self) -> set[str]:
        """The input files and part files of every batch not yet ended."""
        redis = self.ctx.jobs.redis
        names: set[str] = set()
        for batch_id in await batch_records.active(redis):
            names |= {output_part(batch_id), error_part(batch_id)}
            rec = await batch_records.load(redis, batch_id)
            if rec is not None:
                names.add(rec.input_file_id)
        return names

    async def _live(self, contents: list[Stored], now: float) -> set[str]:
        """Those of `contents` whose record exists and has not expired."""
        pipe = self.ctx.jobs.redis.pipeline(transaction=False)
        for entry in contents:
            pipe.hmget(keys.file_record(entry.name), "id", "expires_at")
        live = set()
        replies: list[Any] = await pipe.execute() if contents else []
        for entry, (found, expires_at) in zip(contents, replies, strict=True):
            if found is not None and not 0 < int(expires_at or 0) <= now:
                live.add(entry.name)
        return live
