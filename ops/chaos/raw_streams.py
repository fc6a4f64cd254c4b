"""The raw event streams of a chaos run's jobs, read as an outside consumer would (XRANGE, no
TokenCursor): each token index must be there once and the final event once, whatever the faults
made the workers retry (broker/jobs/events.py refuses what a stream holds)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import redis

from broker import keys
from broker.codec import decode_event
from broker.jobs.events import EVENT_FIELD, is_final
from broker.messages import TokenDelta

BATCH = 200  # streams read per pipeline


def raw_duplicates(client: redis.Redis, job_ids: Iterable[str]) -> dict[str, int]:
    """Over the jobs' raw streams: token indices held more than once, final events past the first,
    and the streams read (those expired or never written are not counted)."""
    ids = list(job_ids)
    tokens = finals = streams = 0
    for at in range(0, len(ids), BATCH):
        pipe = client.pipeline(transaction=False)
        for job_id in ids[at : at + BATCH]:
            pipe.xrange(keys.job_stream(job_id))
        for entries in pipe.execute():
            if entries:
                streams += 1
                extra_tokens, extra_finals = _repeats(entries)
                tokens += extra_tokens
                finals += extra_finals
    return {"raw_duplicated_tokens": tokens, "raw_duplicated_finals": finals, "raw_streams_read": streams}


def _repeats(entries: Any) -> tuple[int, int]:
    seen: set[int] = set()
    repeated = finals = 0
    end = 0  # a delta without an index follows the one before
    for _, fields in entries:
        event = decode_event(fields[EVENT_FIELD])
        if isinstance(event, TokenDelta):
            start = event.start if event.start >= 0 else end
            span = range(start, start + len(event.token_ids))
            repeated += sum(i in seen for i in span)
            seen.update(span)
            end = max(end, span.stop)
        elif is_final(event):
            finals += 1
    return repeated, max(0, finals - 1)
