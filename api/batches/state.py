"""A batch's changes in Redis, each one atomic (a script, api/batches/lua/), so that a runner that
dies between two of them never counts a line twice, and each fenced by the runner lease's token
(api/batches/lease.py), so that a runner that lost its lease writes nothing: LeaseLost instead.

- transition: status `to` (and its `<to>_at` time) only from one of the statuses given;
- feed: the line's jobs recorded as running and the cursor moved past it, only if the cursor is
  still where the runner read it (compare and set);
- skip (feed with no jobs): a bad line (already in the error part) counted failed, likewise;
- done: a running line written to its part: it leaves the running hash and is counted, once;
- finish: the batch's files registered, counts and status set, out of the active list, all at
  once and only from the statuses given: a second finish of an ended batch changes nothing."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from api.batches import scripts
from api.batches.records import BatchRecord, Status
from broker import keys


class LeaseLost(Exception):
    """The runner's lease is another's now: this runner wrote nothing and must stop its pass."""


@dataclass(frozen=True, slots=True)
class Fence:
    redis: Redis
    token: str  # the runner lease's token, "<epoch>|<api>"

    async def run(self, name: str, keys_: list[str], args: list[Any]) -> int:
        lease = [keys.BATCH_RUNNER_LEASE, *keys_]
        got = int(await scripts.run(self.redis, name, lease, [self.token, *args], fenced=True))
        if got < 0:
            raise LeaseLost(self.token)
        return got

    async def check(self) -> None:
        """LeaseLost unless this runner still holds the lease: before a part file is appended to
        (not atomic with the append: a stale append only repeats a line, which finalize drops)."""
        await self.run("check", [], [])


async def transition(fence: Fence, batch_id: str, to: Status, now: int, *from_: Status) -> bool:
    return bool(await fence.run("transition", [keys.batch_record(batch_id)], [to, f"{to}_at", now, *from_]))


async def cancel(redis: Redis, batch_id: str, now: int) -> bool:
    """A client's cancel (not a runner's write: unfenced): validating or in_progress -> cancelling."""
    return bool(await scripts.run(redis, "cancel", [keys.batch_record(batch_id)], [now]))


async def feed(
    fence: Fence, batch_id: str, cursor: int, line_no: int, next_line: int, next_offset: int, running: str
) -> bool:
    """Line `line_no`, read from the cursor at line `cursor` (blank lines may lie between): its
    jobs (`running`, JSON) recorded, or "" for a bad line, counted failed instead."""
    args = [cursor, next_line, next_offset, running, line_no]
    return bool(await fence.run("feed", [keys.batch_record(batch_id), keys.batch_running(batch_id)], args))


async def done(fence: Fence, batch_id: str, line_no: int, outcome: str) -> bool:
    """outcome: "completed" or "failed"; False if the line was already done (counted once)."""
    batch_keys = [keys.batch_record(batch_id), keys.batch_running(batch_id)]
    return bool(await fence.run("done", batch_keys, [line_no, outcome]))


async def update(fence: Fence, batch_id: str, **values: str | int) -> None:
    pairs = [x for k, v in values.items() for x in (k, str(v))]
    await fence.run("update", [keys.batch_record(batch_id)], pairs)


async def running(redis: Redis, batch_id: str) -> dict[int, str]:
    raw: Any = await redis.hgetall(keys.batch_running(batch_id))
    return {int(k): v.decode() for k, v in raw.items()}


async def ended(fence: Fence, rec: BatchRecord) -> None:
    """Out of the runner's list; its running hash is gone (nothing runs for it any more); its
    input file may be deleted; its record expires after its retention."""
    batch_keys = [
        keys.BATCHES_ACTIVE,
        keys.batch_running(rec.id),
        keys.file_readers(rec.input_file_id),
        keys.batch_record(rec.id),
    ]
    await fence.run("ended", batch_keys, [rec.id])


@dataclass(frozen=True, slots=True)
class Ending:
    """What finish writes: the end status, the files (their records as dicts, None for no file),
    the counts, and the errors (None keeps the record's)."""

    status: Status
    output: dict[str, str] | None
    error: dict[str, str] | None
    completed: int
    failed: int
    errors: list[dict[str, Any]] | None = None


async def finish(fence: Fence, rec: BatchRecord, end: Ending, now: int, saved: float, *from_: Status) -> bool:
    """True if this finish ended the batch; False (nothing written) if it was out of `from_`."""
    out_id = end.output["id"] if end.output else ""
    err_id = end.error["id"] if end.error else ""
    batch_keys = [
        keys.batch_record(rec.id),
        keys.BATCHES_ACTIVE,
        keys.batch_running(rec.id),
        keys.file_readers(rec.input_file_id),
        keys.tenant_files(rec.tenant),
        keys.file_record(out_id),
        keys.file_record(err_id),
        keys.tenant_file_sizes(rec.tenant),
    ]
    args = [
        end.status,
        f"{end.status}_at",
        now,
        rec.id,
        out_id,
        err_id,
        end.completed,
        end.failed,
        json.dumps(end.errors) if end.errors is not None else "",
        json.dumps(end.output) if end.output else "",
        json.dumps(end.error) if end.error else "",
        repr(saved),
        *from_,
    ]
    return bool(await fence.run("finish", batch_keys, args))
