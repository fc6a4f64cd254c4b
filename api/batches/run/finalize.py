"""Ending a batch: its part files merged into its output and error files (a torn line dropped,
one line per request id: the first copy, an output line winning over an error line), registered
as the tenant's files (purpose "batch_output"), the counts set from what was written, the status
set, all in one fenced script (state.finish) that ends the batch only once: the files are new ones
each time (fresh ids), so a finalize that comes second (a runner that lost its lease, or a
cancel that came first) never replaces another's files; it removes its own, unnamed. A crash
between the merge and the script leaves unnamed files behind (the file store's collector's).
An expired batch's unanswered lines go to the error file as OpenAI writes them."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

from api.batches import state
from api.batches.lines import line_id, numbered, unrun_line
from api.batches.parts import error_part, output_part, read_part
from api.batches.records import BatchRecord, Status
from api.batches.retention import output_expires_at
from api.batches.run.feeder import Running
from api.context import ApiContext
from api.files.records import FileRecord
from api.files.store import FileStore, new_file_id

_PURPOSE = "batch_output"
EXPIRED = "This request could not be executed before the completion window expired."


@dataclass(frozen=True, slots=True)
class Merged:
    output: int  # lines in the output file
    errors: int
    output_bytes: int
    error_bytes: int


def merge(
    store: FileStore, rec: BatchRecord, unrun: list[tuple[int, int]] | None, ids: tuple[str, str]
) -> Merged:
    """Into new files `ids` (output, error). unrun: for an expired batch, the (line, offset) of
    lines fed but unanswered; the lines never fed (from the cursor on) are unanswered too."""
    seen: set[str] = set()
    sizes = []
    for kind, part, fid in (("output", output_part(rec.id), ids[0]), ("error", error_part(rec.id), ids[1])):
        writer = store.create(fid)
        count = size = 0
        try:
            for record in read_part(store, part):
                if record["id"] in seen:
                    continue
                seen.add(record["id"])
                data = json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
                writer.write(data)
                count, size = count + 1, size + len(data)
            if kind == "error" and unrun is not None:
                for record in _unrun(store, rec, unrun):
                    if record["id"] not in seen:
                        seen.add(record["id"])
                        data = json.dumps(record, ensure_ascii=False).encode() + b"\n"
                        writer.write(data)
                        count, size = count + 1, size + len(data)
            writer.commit()
        except BaseException:
            writer.abort()
            raise
        sizes.append((count, size))
    return Merged(sizes[0][0], sizes[1][0], sizes[0][1], sizes[1][1])


def _unrun(store: FileStore, rec: BatchRecord, fed: list[tuple[int, int]]) -> list[dict[str, Any]]:
    out = []
    with store.open(rec.input_file_id) as f:
        for line_no, offset in sorted(fed):
            f.seek(offset)
            out.append(_expired(rec.id, line_no, f.readline()))
        out.extend(
            _expired(rec.id, n, text) for n, _, text in numbered(f, rec.cursor_offset, rec.cursor_line)
        )
    return out


def _expired(batch_id: str, line_no: int, text: bytes) -> dict[str, Any]:
    try:
        custom_id = json.loads(text).get("custom_id")
    except (ValueError, AttributeError):
        custom_id = None
    return unrun_line(
        line_id(batch_id, line_no),
        custom_id if isinstance(custom_id, str) else None,
        "batch_expired",
        EXPIRED,
    )


async def finalize(
    ctx: ApiContext,
    fence: state.Fence,
    rec: BatchRecord,
    end: Status,
    *from_: Status,
    errors: list[dict[str, Any]] | None = None,
) -> bool:
    """Write the batch's files and end it `end` (from one of `from_`); False if it was not in one
    of them (another runner ended it, or a cancel came first): then nothing is changed, and the
    files written here are removed (no record names them)."""
    store = ctx.files
    unrun = None
    if end == "expired":
        fed = await state.running(ctx.jobs.redis, rec.id)
        unrun = [(n, Running.from_json(text).offset) for n, text in fed.items()]
    ids = (new_file_id(), new_file_id())
    ended = False
    files: dict[str, dict[str, str]] = {}
    try:
        merged = await asyncio.to_thread(merge, store, rec, unrun, ids)
        now = int(time.time())
        expires_at = output_expires_at(rec, now)
        files = {
            kind: FileRecord(
                fid,
                rec.tenant,
                size,
                now,
                f"{rec.id}_{kind}.jsonl",
                _PURPOSE,
                lines=count,
                expires_at=expires_at,
            ).to_hash()
            for kind, fid, count, size in (
                ("output", ids[0], merged.output, merged.output_bytes),
                ("error", ids[1], merged.errors, merged.error_bytes),
            )
            if count
        }
        ending = state.Ending(
            end, files.get("output"), files.get("error"), merged.output, merged.errors, errors
        )
        ended = await state.finish(fence, rec, ending, now, time.time(), *from_)
    finally:
        kinds = zip(ids, ("output", "error"), strict=True)
        unused = [fid for fid, kind in kinds if not ended or kind not in files]
        if ended:
            unused += [output_part(rec.id), error_part(rec.id)]
        for name in unused:
            await asyncio.to_thread(store.delete, name)
    return ended
