"""STAND-INS for what other parts of issue 25 provide, in this one place, removed at merge:
- free_slots_or_standin: helper B's api/dispatch/capacity.free_slots(ctx);
- observe_queue_wait: helper B's ctx.metrics.observe_queue_wait(tenant, job_class, seconds);
- batch_job: helper A's GenerateJob fields job_class/priority/batch_id;
- weight: helper B's KeyRing.weight(tenant);
"""

from __future__ import annotations

import msgspec

from api.context import ApiContext
from broker.messages import GenerateJob

STANDIN_FREE_SLOTS = 64  # until B's window exists: feed up to this many lines at once


def observe_queue_wait(ctx: ApiContext, tenant: str, job_class: str, seconds: float) -> None:
    observe = getattr(ctx.metrics, "observe_queue_wait", None)
    if observe is not None:
        observe(tenant, job_class, seconds)


def batch_job(job: GenerateJob, batch_id: str) -> GenerateJob:
    fields = {"job_class": "batch", "batch_id": batch_id}
    known = {k: v for k, v in fields.items() if k in GenerateJob.__struct_fields__}
    return msgspec.structs.replace(job, **known)


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
