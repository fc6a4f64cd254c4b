"""A job's event stream in Redis: the worker appends, readers (api, CLI, tests) follow it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis

from broker import keys
from broker.codec import decode_event, encode_event
from broker.messages import JobDone, JobFailed, StreamEvent, TokenDelta

STREAM_TTL_S = 86400  # as long as results and job metadata live
EVENT_FIELD = b"e"


@dataclass(frozen=True, slots=True)
class StreamProgress:
    """What a job's stream already holds: lets a redelivered job resume instead of restarting."""

    token_ids: tuple[int, ...]
    text_chars: int
    done: JobDone | None


def publish(client: redis.Redis, job_id: str, event: StreamEvent, check_cancel: bool = False) -> bool:
    """Append one event (and refresh the stream's TTL) in one round trip; returns whether the job
    has been cancelled when check_cancel is set."""
    pipe = client.pipeline(transaction=False)
    pipe.xadd(keys.job_stream(job_id), {EVENT_FIELD: encode_event(event)})
    pipe.expire(keys.job_stream(job_id), STREAM_TTL_S)
    if check_cancel:
        pipe.exists(keys.job_cancel(job_id))
    replies = pipe.execute()
    return bool(check_cancel and replies[-1])


def progress(client: redis.Redis, job_id: str) -> StreamProgress:
    tokens: list[int] = []
    chars = 0
    done = None
    entries: Any = client.xrange(keys.job_stream(job_id))
    for _, fields in entries:
        event = decode_event(fields[EVENT_FIELD])
        if isinstance(event, TokenDelta):
            tokens.extend(event.token_ids)
            chars += len(event.text)
        elif isinstance(event, JobDone):
            done = event
        elif isinstance(event, JobFailed):  # a failed attempt: start over
            tokens, chars = [], 0
    return StreamProgress(tuple(tokens), chars, done)


def follow(
    client: redis.Redis, job_id: str, timeout_s: float = 600.0, block_ms: int = 1000
) -> Iterator[StreamEvent]:
    """Every event of the job from the start, blocking for new ones, until done or failed."""
    last = "0-0"
    deadline = time.monotonic() + timeout_s
    stream = keys.job_stream(job_id)
    while time.monotonic() < deadline:
        reply: Any = client.xread({stream: last}, block=block_ms, count=256)  # redis-py types are loose
        for _, entries in reply or []:
            for entry_id, fields in entries:
                last = entry_id
                event = decode_event(fields[EVENT_FIELD])
                yield event
                if isinstance(event, (JobDone, JobFailed)):
                    return
    raise TimeoutError(f"job {job_id} produced no final event within {timeout_s:.0f}s")
