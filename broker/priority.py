"""Job classes and priority bands: the order in which workers take jobs off their queues.

Two classes: interactive (the online endpoints, /v1/jobs, plain Celery tasks) and batch (lines of
a Batch API batch); within a class, vLLM's per-request `priority` (lower is served earlier).

Celery/kombu priorities on Redis, not separate queues: kombu's Redis channel rotates the order of
a worker's queues after each BRPOP, so queues of their own could not give a strict order; its
priority lists are BRPOPed priority-major across every queue a worker consumes, in one command,
so a message in a lower band is always taken before one in a higher band, whichever queue holds
it. kombu on Redis serves band 0 first. Each band of a queue is a Redis list of its own: the bare
queue name for band 0, else the name, kombu's separator and the band (kombu's `_q_for_pri`); with
priority_steps 0..9 (broker/celery_app.py) a message's band is its `properties.priority` as is.

Interactive jobs take bands 0..4 (2 for priority 0), batch lines 5..9 (7 for priority 0): a batch
line never overtakes an interactive job. The engine then orders exactly by (class, priority,
arrival) among the jobs a worker holds (workers/engine/wait_queue.py).
"""

from __future__ import annotations

from typing import Any, Literal

JobClass = Literal["interactive", "batch"]
PRIORITY_STEPS: tuple[int, ...] = tuple(range(10))
SEP = "\x06\x16"  # kombu.transport.redis.Channel.sep: between a queue's name and its band
# Each class's band for priority 0 and its bounds: (base, lowest band, highest band).
_BANDS: dict[str, tuple[int, int, int]] = {"interactive": (2, 0, 4), "batch": (7, 5, 9)}
PRIORITY_LIMIT = 2**31 - 1  # |priority| at the api (vLLM's field is an int)


def band(job_class: JobClass, priority: int) -> int:
    """The kombu priority (0 served first) of a job of this class and priority."""
    base, low, high = _BANDS[job_class]
    return min(max(base + priority, low), high)


def queue_key(queue: str, band: int) -> str:
    """The Redis list kombu keeps `queue`'s messages of this band in."""
    return f"{queue}{SEP}{band}" if band else queue


def queue_keys(queue: str) -> list[str]:
    """Every band's list of `queue`, in the order workers take them (band 0 first)."""
    return [queue_key(queue, b) for b in PRIORITY_STEPS]


def split_key(key: str) -> tuple[str, int]:
    """(queue, band) of a band list key (queue_key's inverse)."""
    name, sep, tail = key.rpartition(SEP)
    if sep and tail.isdigit():
        return name, int(tail)
    return key, 0


def message_band(payload: Any) -> int:
    """The band of a kombu message (its properties.priority, bounded as kombu bounds it; 0 when
    it has none)."""
    props = payload.get("properties") if isinstance(payload, dict) else None
    try:
        value = int(props["priority"]) if isinstance(props, dict) else 0
    except (KeyError, TypeError, ValueError):
        return 0
    return min(max(value, PRIORITY_STEPS[0]), PRIORITY_STEPS[-1])


def job_band(job: Any) -> int:
    """The band of a job as its wire form (a dict: broker.codec.encode_job) or a GenerateJob."""
    if isinstance(job, dict):
        return band(job.get("job_class", "interactive"), int(job.get("priority", 0)))
    return band(job.job_class, job.priority)
