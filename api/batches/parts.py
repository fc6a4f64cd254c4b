"""A batch's part files in the file store: its output and error lines appended as lines finish
(each append fsynced before the line is marked done in Redis; opening a part drops a torn last
line). Finalize merges them into the batch's output and error files."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from api.batches import records
from api.batches.metrics import BatchMetrics
from api.files.store import FileStore


def output_part(batch_id: str) -> str:
    return f"{batch_id}.output.part"


def error_part(batch_id: str) -> str:
    return f"{batch_id}.errors.part"


def _encode(record: dict[str, Any]) -> bytes:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


@dataclass
class Parts:
    store: FileStore
    metrics: BatchMetrics

    async def output(self, batch_id: str, records: list[dict[str, Any]]) -> None:
        await asyncio.to_thread(self._append, output_part(batch_id), records)

    async def errors(self, batch_id: str, records: list[dict[str, Any]]) -> None:
        await asyncio.to_thread(self._append, error_part(batch_id), records)

    def _append(self, name: str, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        appender = self.store.append(name)
        try:
            appender.append_lines(_encode(r) for r in records)
        finally:
            appender.close()


def read_part(store: FileStore, name: str) -> Iterator[dict[str, Any]]:
    """Every whole line of a part (none if it does not exist); a line that does not parse (torn
    by a crash before its fsync) is dropped."""
    try:
        f = store.open(name)
    except FileNotFoundError:
        return
    with f:
        for text in f:
            if not text.endswith(b"\n"):
                continue
            try:
                record = json.loads(text)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("id"), str):
                yield record


async def in_use(redis: Redis) -> set[str]:
    """The names in the file store of the input files and part files of every batch not yet ended
    (what the file sweeper keeps: api/files/sweeper.py)."""
    names: set[str] = set()
    for batch_id in await records.active(redis):
        names |= {output_part(batch_id), error_part(batch_id)}
        rec = await records.load(redis, batch_id)
        if rec is not None:
            names.add(rec.input_file_id)
    return names
