"""Reading a batch's input file from the store, never whole: a few lines from the runner's cursor,
one line at its offset (to rebuild a finished line's request), or a pass over all of it (the
validation's count and duplicate check). Blocking: callers run these in a thread."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from api.batches.lines import numbered
from api.files.store import FileStore

MAX_ERRORS = 100  # validation errors kept in the batch's record (OpenAI's list is short too)


@dataclass(frozen=True, slots=True)
class Chunk:
    lines: list[tuple[int, int, bytes]]  # (line number, offset, text)
    next_line: int  # the cursor after them
    next_offset: int
    at_end: bool  # nothing follows them


def read_from(store: FileStore, file_id: str, offset: int, line_no: int, count: int) -> Chunk:
    lines: list[tuple[int, int, bytes]] = []
    with store.open(file_id) as f:
        for n, at, text in numbered(f, offset, line_no):
            if len(lines) == count:
                return Chunk(lines, n, at, False)
            lines.append((n, at, text))
        f.seek(0, 2)
        end = f.tell()
    # the file ends within `count`: the cursor past its end (trailing blank lines feed nothing)
    return Chunk(lines, lines[-1][0] + 1 if lines else line_no, end, True)


def read_at(store: FileStore, file_id: str, offset: int) -> bytes:
    with store.open(file_id) as f:
        f.seek(offset)
        return f.readline()


def validate(store: FileStore, file_id: str) -> tuple[int, list[dict[str, Any]]]:
    """(requests in the file, errors that fail the whole batch: none, or repeated custom_ids,
    or an empty file). A bad line alone does not fail it: it goes to the error file."""
    total, seen = 0, set()
    errors: list[dict[str, Any]] = []
    with store.open(file_id) as f:
        for n, _, text in numbered(f):
            total += 1
            try:
                record = json.loads(text)
            except ValueError:
                continue  # reported in the error file when fed
            custom_id = record.get("custom_id") if isinstance(record, dict) else None
            if not isinstance(custom_id, str):
                continue
            if custom_id in seen and len(errors) < MAX_ERRORS:
                message = f"The custom_id {custom_id!r} of line {n} is used by an earlier line"
                errors.append(
                    {"code": "duplicate_custom_id", "message": message, "param": "custom_id", "line": n}
                )
            seen.add(custom_id)
    if not total:
        errors.append(
            {"code": "empty_file", "message": "the input file holds no request", "param": None, "line": None}
        )
    return total, errors
