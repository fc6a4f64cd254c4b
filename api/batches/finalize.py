"""Ending a batch: its part files merged into its output and error files (a torn line dropped,
one line per request id: the first copy, an output line winning over an error line), registered
as the tenant's files (purpose "batch_output"), the counts set from what was written, the status
set. The file ids derive from the batch's, so finalizing again after a crash rewrites the same
files. An expired batch's unanswered lines go to the error file as OpenAI writes them."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from api.batches import state
from api.batches.feeder import Running
from api.batches.lines import line_id, numbered, unrun_line
from api.batches.parts import error_part, output_part, read_part
from api.batches.records import BatchRecord, Status
from api.batches.retention import output_expires_at
from api.context import ApiContext
from api.files import records as file_records
from api.files.records import FileRecord
from api.files.store import FileStore

_FILE_IDS = uuid.UUID("c2b8f5f4-7d2a-4a8e-9a53-0e6a1f3d7b25")
EXPIRED = "This request could not be executed before the completion window expired."


def file_id(batch_id: str, kind: str) -> str:
    return f"file-{uuid.uuid5(_FILE_IDS, f'{batch_id}:{kind}').hex}"


@dataclass(frozen=True, slots=True)
class Merged:
    output: int  # lines in the output file
    errors: int
    output_bytes: int
    error_bytes: int


def merge(store: FileStore, rec: BatchRecord, unrun: list[tuple[int, int]] | None) -> Merged:
    """unrun: for an expired batch, the (line, offset) of lines fed but unanswered; the lines never
    fed (from the cursor on) are unanswered too."""
    seen: set[str] = set()
    sizes = []
    for kind, part in (("output", output_part(rec.id)), ("error", error_part(rec.id))):
        writer = store.create(file_id(rec.id, kind))
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


async def finalize(ctx: ApiContext, rec: BatchRecord, end: Status, *from_: Status) -> None:
    """Write the batch's files and end it `end` (from one of `from_`)."""
    store = ctx.files
    redis = ctx.jobs.redis
    unrun = None
    if end == "expired":
        fed = await state.running(redis, rec.id)
        unrun = [(n, Running.from_json(text).offset) for n, text in fed.items()]
    merged = await asyncio.to_thread(merge, store, rec, unrun)
    now = int(time.time())
    expires_at = output_expires_at(rec, now)
    ids = {}
    for kind, count, size in (
        ("output", merged.output, merged.output_bytes),
        ("error", merged.errors, merged.error_bytes),
    ):
        fid = file_id(rec.id, kind)
        if not count:
            await asyncio.to_thread(store.delete, fid)
            ids[kind] = ""
            continue
        name = f"{rec.id}_{kind}.jsonl"
        await file_records.save(
            redis,
            FileRecord(fid, rec.tenant, size, now, name, "batch_output", lines=count, expires_at=expires_at),
        )
        ids[kind] = fid
    await state.update(
        redis,
        rec.id,
        output_file_id=ids["output"],
        error_file_id=ids["error"],
        completed=merged.output,
        failed=merged.errors,
    )
    if await state.transition(redis, rec.id, end, now, *from_):
        await state.ended(redis, rec.id)
        for part in (output_part(rec.id), error_part(rec.id)):
            await asyncio.to_thread(store.delete, part)
