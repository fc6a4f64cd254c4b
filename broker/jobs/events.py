"""A job's event stream in Redis: the worker appends, readers (api, CLI, tests) follow it.

A worker writes through FencedStream: one Lua script checks the writer's lease epoch is still the
job's (broker/jobs/lease.py) before it appends, so a worker that lost its job cannot add a token,
and appends only the token indices (and the final event) the stream does not hold yet, so a script
that redis-py retried after its reply was lost appends nothing twice: even a consumer of the raw
stream sees each token index once and one final event. Readers also pass every event through a
TokenCursor, which shows each token index once, in order (older streams, unindexed producers)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import redis

from broker import keys
from broker.codec import decode_event
from broker.defaults import DEFAULTS
from broker.jobs.lease import StaleLeaseError
from broker.jobs.stream_append import FENCED_XADD, NO_FENCE, is_final, script_args, script_keys
from broker.messages import JobDone, JobFailed, StreamEvent, TokenDelta, TokenLogprob

STREAM_TTL_S = DEFAULTS.job_ttl_s  # as long as results and job metadata live
EVENT_FIELD = b"e"


@dataclass(frozen=True, slots=True)
class StreamProgress:
    """What a job's stream already holds: lets a redelivered job resume instead of restarting."""

    token_ids: tuple[int, ...]
    text_chars: int
    done: JobDone | None
    failed: JobFailed | None = None
    epoch: int = 0  # of the last event
    logprobs: tuple[TokenLogprob, ...] = ()  # of token_ids, when the job asked for them
    prompt_logprobs: tuple[TokenLogprob, ...] = ()  # as the delta that started the output had them

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
        shown = max(0, self.tokens - start)
        ids = event.token_ids[shown:]
        text = event.text[max(0, self.chars - text_start) :]
        if not ids and not text:
            return None
        first = self.tokens == 0 and start == 0  # the prompt's echo rides on the output's start
        self.tokens = max(self.tokens, start + len(event.token_ids))
        self.chars = max(self.chars, text_start + len(event.text))
        return msgspec.structs.replace(
            event,
            token_ids=ids,
            text=text,
            start=self.tokens - len(ids),
            text_start=self.chars - len(text),
            logprobs=event.logprobs[shown:],
            prompt_logprobs=event.prompt_logprobs if first else (),
            prompt_text=event.prompt_text if first else "",
        )


def publish(client: redis.Redis, job_id: str, event: StreamEvent, check_cancel: bool = False) -> bool:
    """Append one event unfenced (producers without leases: test doubles, tools); returns whether
    the job has been cancelled when check_cancel is set. Workers use FencedStream."""
    reply = FENCED_XADD(
        client, script_keys(job_id, ""), script_args(NO_FENCE, STREAM_TTL_S, job_id, [event], None)
    )
    return bool(check_cancel and int(reply))


class FencedStream:
    """Epoch-checked appends to job streams (lua/fenced_xadd.lua)."""

    def __init__(self, client: redis.Redis, ttl_s: int = STREAM_TTL_S) -> None:
        self.client = client
        self.ttl_s = ttl_s

    def publish(self, job_id: str, tenant: str, event: StreamEvent) -> bool:
        """Append `event` if its epoch is the job's current one, else raise StaleLeaseError. A
        final event also takes the job off its tenant's job set. Returns whether it is cancelled."""
        return self.publish_many(job_id, tenant, [event])

    def publish_many(
        self, job_id: str, tenant: str, events: list[StreamEvent], stages: dict[str, float] | None = None
    ) -> bool:
        """publish() for a run of events of one epoch, in one round trip; only the last may be
        final. `stages` (with a final event): the attempt's stage times, kept in keys.job_stages."""
        epoch = events[-1].epoch
        assert all(e.epoch == epoch for e in events) and not any(is_final(e) for e in events[:-1])
        reply = FENCED_XADD(
            self.client, script_keys(job_id, tenant), script_args(epoch, self.ttl_s, job_id, events, stages)
        )
        if int(reply) < 0:
            raise StaleLeaseError(f"job {job_id}: epoch {epoch} is no longer current; write refused")
        return bool(int(reply))


def ended(client: redis.Redis, job_id: str) -> bool:
    """Whether the job's stream ends in its final event (JobDone or JobFailed)."""
    last: Any = client.xrevrange(keys.job_stream(job_id), count=1)
    return bool(last) and isinstance(decode_event(last[0][1][EVENT_FIELD]), (JobDone, JobFailed))


def progress(client: redis.Redis, job_id: str) -> StreamProgress:
    """The tokens the stream holds (each index once) and its final event, if any. A final event
    is final: a redelivered copy of a job that ended returns (or raises) the same outcome."""
    entries: Any = client.xrange(keys.job_stream(job_id))
    return progress_of(entries)


def progress_of(entries: Any) -> StreamProgress:
    """progress() of a stream's entries, as XRANGE returned them (read in a caller's pipeline)."""
    cursor = TokenCursor()
    tokens: list[int] = []
    logprobs: list[TokenLogprob] = []
    prompt_logprobs: tuple[TokenLogprob, ...] = ()
    done, failed, epoch = None, None, 0
    for _, fields in entries:
        event = cursor.accept(decode_event(fields[EVENT_FIELD]))
        if event is None:
            continue
        epoch = event.epoch
        if isinstance(event, TokenDelta):
            tokens.extend(event.token_ids)
            logprobs.extend(event.logprobs)
            prompt_logprobs = prompt_logprobs or event.prompt_logprobs
        elif isinstance(event, JobDone):
            done = done or event
        elif failed is None and done is None:
            failed = event
    return StreamProgress(tuple(tokens), cursor.chars, done, failed, epoch, tuple(logprobs), prompt_logprobs)


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
