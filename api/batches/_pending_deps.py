"""STAND-INS for what other parts of issue 25 provide, in this one place, removed at merge:
- free_slots_or_standin: helper B's api/dispatch/capacity.free_slots(ctx);
- observe_queue_wait: helper B's ctx.metrics.observe_queue_wait(tenant, job_class, seconds);
- batch_job: helper A's GenerateJob fields job_class/priority/batch_id;
- weight: helper B's KeyRing.weight(tenant);
- file_store: where the api keeps its FileStore (helper C's routes decide: ctx or app state)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import msgspec

from api.context import ApiContext
from api.files.store import DirStore, FileStore
from broker.messages import GenerateJob

STANDIN_FREE_SLOTS = 64  # until B's window exists: feed up to this many lines at once
_stores: dict[int, FileStore] = {}


def observe_queue_wait(ctx: ApiContext, tenant: str, job_class: str, seconds: float) -> None:
    observe = getattr(ctx.metrics, "observe_queue_wait", None)
    if observe is not None:
        observe(tenant, job_class, seconds)


def batch_job(job: GenerateJob, batch_id: str) -> GenerateJob:
    fields = {"job_class": "batch", "batch_id": batch_id}
    known = {k: v for k, v in fields.items() if k in GenerateJob.__struct_fields__}
    return msgspec.structs.replace(job, **known)


def file_store(ctx: ApiContext) -> FileStore:
    found: Any = getattr(ctx, "files", None)
    if found is not None:
        return found  # type: ignore[no-any-return,unused-ignore]
    store = _stores.get(id(ctx))
    if store is None:
        root = getattr(ctx.config, "files_dir", None) or Path(tempfile.gettempdir()) / "kvferry-files"
        store = _stores[id(ctx)] = DirStore(Path(root))
    return store


async def free_slots_or_standin(ctx: ApiContext, batch_lines_running: int) -> int:
    """B's free_slots counts batch jobs in flight (INFLIGHT); the stand-in counts the runner's."""
    try:
        from api.dispatch.capacity import free_slots as real  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return max(0, STANDIN_FREE_SLOTS - batch_lines_running)
    return int(await real(ctx))


def weight(ctx: ApiContext, tenant: str) -> float:
    """B's KeyRing.weight(tenant); 1 until it lands."""
    found = getattr(ctx.keys, "weight", None)
    return float(found(tenant)) if found is not None else 1.0
