"""The one Lua script that appends to a job's event stream, fenced by the lease epoch and
idempotent by token index (broker/jobs/events.py's FencedStream runs it), and its arguments."""

from __future__ import annotations

from typing import Any

from broker import keys
from broker.codec import encode_event
from broker.messages import JobDone, JobFailed, StreamEvent, TokenDelta
from broker.redis.lua import Script

STAGES_TTL_S = 3600  # a job's stage times are read right after it ends (`bench queue`), or never
NO_FENCE = "-"  # the epoch argument of producers without leases (test doubles, tools)

# One round trip appends a run of events (the last token delta and the final event ride together):
# lua/fenced_xadd.lua, its KEYS from script_keys() and its ARGV from script_args().
# Idempotent by index: a delta is appended only if it goes past the held token or character end,
# a final only if none is in (a stream that holds its final takes nothing more), and the final's
# bookkeeping (end stream, tenant job set, stage times) runs with the final it appends. So a
# script that redis-py retried after its reply was lost appends nothing twice. A delta that only
# partly overlaps what is held is appended whole (the client encoded it; readers cut it): a
# redelivered attempt resumes exactly at the held end, so none is sent.
FENCED_XADD = Script(__file__, "fenced_xadd")


def script_keys(job_id: str, tenant: str) -> list[str]:
    """KEYS of lua/fenced_xadd.lua, in its order."""
    return [
        keys.job_stream(job_id),
        keys.job_epoch(job_id),
        keys.job_cancel(job_id),
        keys.tenant_jobs(tenant),
        keys.job_end(job_id),
        keys.job_stages(job_id),
        keys.job_written(job_id),
        keys.INFLIGHT,
        keys.tenant_inflight(tenant),
    ]


def _span(event: StreamEvent) -> tuple[int, int, int, int]:
    """(first token index, tokens, first character, characters) of an event; a final spans none."""
    if isinstance(event, TokenDelta):
        return event.start, len(event.token_ids), event.text_start, len(event.text)
    return 0, 0, 0, 0


def script_args(
    epoch: int | str, ttl_s: int, job_id: str, events: list[StreamEvent], stages: dict[str, float] | None
) -> list[Any]:
    """ARGV of lua/fenced_xadd.lua: the epoch (or NO_FENCE), the run of events with their spans,
    and with a final event its stage times."""
    final = is_final(events[-1])
    args: list[Any] = [epoch, ttl_s, job_id, "1" if final else "0", len(events)]
    for event in events:
        args.append(encode_event(event))
        args.extend(_span(event))
    if final and stages:
        for name, at in stages.items():
            args.extend((name, repr(at)))
        args.append(STAGES_TTL_S)
    return args


def is_final(event: StreamEvent | None) -> bool:
    return isinstance(event, (JobDone, JobFailed))
