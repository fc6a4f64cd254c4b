"""A batch runner rig for the race tests: the api's context on a private redis-server (no served
app's runner competes for the lease), a fake worker answering its jobs, input files written to
the store, and passes driven by hand, so a test forces the interleaving it wants."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis

from api.app import create_app
from api.batches import records
from api.batches.records import BatchRecord
from api.batches.run.runner import BatchRunner
from api.config import ApiConfig
from api.context import ApiContext
from api.files import records as file_records
from api.files.records import FileRecord
from api.files.store import new_file_id
from broker import keys
from broker.messages import WorkerStatus
from broker.worker_registry import HEARTBEAT_FIELD, encode_status

MODEL = "smollm2"


def context(redis_url: str, files_dir: Path) -> ApiContext:
    config = ApiConfig(redis_url=redis_url, served_models=(MODEL,), files_dir=files_dir, dispatch_headroom=0)
    ctx = create_app(config).state.ctx
    assert isinstance(ctx, ApiContext)
    return ctx


def beat(rds: redis.Redis, concurrency: int) -> None:
    """A live worker saying its concurrency: the batch window (headroom 0)."""
    name = "fake@test"
    status = WorkerStatus(name, keys.worker_queue(name), MODEL, 0, 0, 0, time.time(), concurrency=concurrency)
    rds.hset(keys.worker_heartbeat(name), HEARTBEAT_FIELD, encode_status(status))
    rds.expire(keys.worker_heartbeat(name), 60)
    rds.sadd(keys.WORKERS, name)


def line(custom_id: str, prompt: str = "hi", **body: Any) -> dict[str, Any]:
    payload = {"model": MODEL, "prompt": prompt, "max_tokens": 3, **body}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": payload}


async def upload(ctx: ApiContext, tenant: str, lines: list[dict[str, Any]]) -> str:
    file_id = new_file_id()
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    writer = ctx.files.create(file_id)
    writer.write(data)
    writer.commit()
    rec = FileRecord(file_id, tenant, len(data), int(time.time()), "in.jsonl", "batch", lines=len(lines))
    await file_records.save(ctx.jobs.redis, rec)
    return file_id


async def create(ctx: ApiContext, tenant: str, lines: list[dict[str, Any]], expires_in: int = 3600) -> str:
    now = int(time.time())
    file_id = await upload(ctx, tenant, lines)
    rec = BatchRecord(records.new_batch_id(), tenant, "/v1/completions", file_id, now, now + expires_in)
    await records.create(ctx.jobs.redis, rec)
    return rec.id


async def load(ctx: ApiContext, batch_id: str) -> BatchRecord:
    rec = await records.load(ctx.jobs.redis, batch_id)
    assert rec is not None
    return rec


async def passes(
    runner: BatchRunner, until: Callable[[], Awaitable[bool]], timeout_s: float = 20, beat_to: Any = None
) -> None:
    """The runner's passes (holding its lease, as BatchRunner.run) until `until()` holds."""
    deadline = time.monotonic() + timeout_s
    while not await until():
        assert time.monotonic() < deadline, "the runner did not get there in time"
        if beat_to is not None:
            beat(*beat_to)
        if await runner.lease.hold():
            await runner.run_pass()
        await _sleep()


async def _sleep() -> None:
    import asyncio

    await asyncio.sleep(0.02)


def file_lines(ctx: ApiContext, file_id: str) -> list[dict[str, Any]]:
    with ctx.files.open(file_id) as f:
        return [json.loads(x) for x in f]


def parts_left(files_dir: Path) -> list[str]:
    return sorted(p.name for p in files_dir.iterdir() if p.name.endswith(".part"))
