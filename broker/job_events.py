"""A job's event stream in Redis: the worker appends, readers (api, CLI, tests) follow it.

A worker writes through FencedStream: one Lua script checks the writer's lease epoch is still the
job's (broker/job_lease.py) before it appends, so a worker that lost its job cannot add a token.
Readers pass every event through a TokenCursor, which shows each token index once, in order,
however many times the job was redelivered."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis

from broker import keys
from broker.codec import decode_event, encode_event
from broker.job_lease import StaleLeaseError
from broker.messages import JobDone, JobFailed, StreamEvent, TokenDelta

STREAM_TTL_S = 86400  # as long as results and job metadata live
EVENT_FIELD = b"e"

# KEYS: stream, epoch, cancel flag, the tenant's job set. ARGV: epoch, event, stream TTL, final
# ("1": the job's last event, which also ends its place in the tenant's job limit), job id.
# Returns -1 when the epoch is not current (nothing written), else whether the job is cancelled.
_FENCED_XADD = """
if tonumber(redis.call('GET', KEYS[2]) or '0') ~= tonumber(ARGV[1]) then return -1 end
redis.call('XADD', KEYS[1], '*', 'e', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
if ARGV[4] == '1' then redis.call('ZREM', KEYS[4], ARGV[5]) end
return redis.call('EXISTS', KEYS[3])
"""


@dataclass(frozen=True, slots=True)
class StreamProgress:
    """What a job's stream already holds: lets a redelivered job resume instead of restarting."""

    token_ids: tuple[int, ...]
    text_chars: int
    done: JobDone | None
    failed: JobFailed | None = None
    epoch: int = 0  # of the last event

    @property
    def final(self) -> bool:
        return self.done is not None or self.failed is not None


class TokenCursor:
    """Each token index (and text character) once, in order: a delta's part already shown is cut
    off, a delta with nothing new is dropped. Deltas without an index follow the previous one."""

    def __init__(self) -> None:
        self.tokens = 0
        self.chars = 0

    def accept(self, event: StreamEvent) -> StreamEvent | None:
        if not isinstance(event, TokenDelta):
            return event
        start = event.start if event.start >= 0 else self.tokens
        text_start = event.text_start if event.text_start >= 0 else self.chars
        ids = event.token_ids[max(0, self.tokens - start) :]
        text = event.text[max(0, self.chars - text_start) :]
        if not ids and not text:
            return None
        self.tokens = max(self.tokens, start + len(event.token_ids))
        self.chars = max(self.chars, text_start + len(event.text))
        return dataclasses.replace(
            event, token_ids=ids, text=text, start=self.tokens - len(ids), text_start=self.chars - len(text)
        )


def publish(client: redis.Redis, job_id: str, event: StreamEvent, check_cancel: bool = False) -> bool:
    """Append one event unfenced (producers without leases: test doubles, tools); returns whether
    the job has been cancelled when check_cancel is set. Workers use FencedStream."""
    pipe = client.pipeline(transaction=False)
    pipe.xadd(keys.job_stream(job_id), {EVENT_FIELD: encode_event(event)})
    pipe.expire(keys.job_stream(job_id), STREAM_TTL_S)
    if check_cancel:
        pipe.exists(keys.job_cancel(job_id))
    replies = pipe.execute()
    return bool(check_cancel and replies[-1])


class FencedStream:
    """Epoch-checked appends to job streams (the script is registered once per client)."""

    def __init__(self, client: redis.Redis, ttl_s: int = STREAM_TTL_S) -> None:
        self._xadd = client.register_script(_FENCED_XADD)
        self.ttl_s = ttl_s

    def publish(self, job_id: str, tenant: str, event: StreamEvent) -> bool:
        """Append `event` if its epoch is the job's current one, else raise StaleLeaseError. A
        final event also takes the job off its tenant's job set. Returns whether it is cancelled."""
        final = isinstance(event, (JobDone, JobFailed))
        reply = self._xadd(
            keys=[
                keys.job_stream(job_id),
                keys.job_epoch(job_id),
                keys.job_cancel(job_id),
                keys.tenant_jobs(tenant),
            ],
            args=[event.epoch, encode_event(event), self.ttl_s, "1" if final else "0", job_id],
        )
        if int(reply) < 0:
            raise StaleLeaseError(f"job {job_id}: epoch {event.epoch} is no longer current; write refused")
        return bool(int(reply))


def ended(client: redis.Redis, job_id: str) -> bool:
    """Whether the job's stream ends in its final event (JobDone or JobFailed)."""
    last: Any = client.xrevrange(keys.job_stream(job_id), count=1)
    return bool(last) and isinstance(decode_event(last[0][1][EVENT_FIELD]), (JobDone, JobFailed))


def progress(client: redis.Redis, job_id: str) -> StreamProgress:
    """The tokens the stream holds (each index once) and its final event, if any. A final event
    is final: a redelivered copy of a job that ended returns (or raises) the same outcome."""
    cursor = TokenCursor()
    tokens: list[int] = []
    done, failed, epoch = None, None, 0
    entries: Any = client.xrange(keys.job_stream(job_id))
    for _, fields in entries:
        event = cursor.accept(decode_event(fields[EVENT_FIELD]))
        if event is None:
            continue
        epoch = event.epoch
        if isinstance(event, TokenDelta):
            tokens.extend(event.token_ids)
        elif isinstance(event, JobDone):
            done = done or event
        elif failed is None and done is None:
            failed = event
    return StreamProgress(tuple(tokens), cursor.chars, done, failed, epoch)


def follow(
    client: redis.Redis, job_id: str, timeout_s: float = 600.0, block_ms: int = 1000
) -> Iterator[StreamEvent]:
    """Every event of the job from the start (each token once), blocking for new ones, until done
    or failed."""
    last = "0-0"
    deadline = time.monotonic() + timeout_s
    stream = keys.job_stream(job_id)
    cursor = TokenCursor()
    while time.monotonic() < deadline:
        reply: Any = client.xread({stream: last}, block=block_ms, count=256)  # redis-py types are loose
        for _, entries in reply or []:
            for entry_id, fields in entries:
                last = entry_id
                event = cursor.accept(decode_event(fields[EVENT_FIELD]))
                if event is None:
                    continue
                yield event
                if isinstance(event, (JobDone, JobFailed)):
                    return
    raise TimeoutError(f"job {job_id} produced no final event within {timeout_s:.0f}s")
