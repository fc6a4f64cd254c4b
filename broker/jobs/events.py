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
from broker.codec import decode_event, encode_event
from broker.defaults import DEFAULTS
from broker.jobs.lease import StaleLeaseError
from broker.messages import JobDone, JobFailed, StreamEvent, TokenDelta, TokenLogprob

STREAM_TTL_S = DEFAULTS.job_ttl_s  # as long as results and job metadata live
EVENT_FIELD = b"e"

STAGES_TTL_S = 3600  # a job's stage times are read right after it ends (`bench queue`), or never
NO_FENCE = "-"  # the epoch argument of producers without leases (test doubles, tools)

# One round trip appends a run of events (the last token delta and the final event ride together).
# KEYS: stream, epoch, cancel flag, the tenant's job set, end stream, stage-times hash, and
# keys.job_written: how far the stream goes (t: next token index, c: next text character, f: 1
# once its final event is in).
# ARGV: epoch (or NO_FENCE), stream TTL, job id, final ("1": the last event ends the job, which
# also ends its place in the tenant's job limit), n, then n groups of 5 (encoded event, its first
# token index, tokens, first character, characters; an index -1: right after what is held), then
# stage name/time pairs (final only; Redis' own clock adds "written"), stages TTL last.
# Returns -1 when the epoch is not current (nothing written), else whether the job is cancelled.
# Idempotent by index: a delta is appended only if it goes past the held token or character end,
# a final only if none is in (a stream that holds its final takes nothing more), and the final's
# bookkeeping (end stream, tenant job set, stage times) runs with the final it appends. So a
# script that redis-py retried after its reply was lost appends nothing twice. A delta that only
# partly overlaps what is held is appended whole (the client encoded it; readers cut it): a
# redelivered attempt resumes exactly at the held end, so none is sent.
_FENCED_XADD = """
if ARGV[1] ~= '-' and tonumber(redis.call('GET', KEYS[2]) or '0') ~= tonumber(ARGV[1]) then
  return -1
end
local held = redis.call('HMGET', KEYS[7], 't', 'c', 'f')
local t, c = tonumber(held[1] or '0'), tonumber(held[2] or '0')
if held[3] ~= '1' then
  local n = tonumber(ARGV[5])
  local last = n
  if ARGV[4] == '1' then last = n - 1 end
  for i = 0, last - 1 do
    local at = 6 + 5 * i
    local s, cs = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 3])
    if s < 0 then s = t end
    if cs < 0 then cs = c end
    local e, ce = s + tonumber(ARGV[at + 2]), cs + tonumber(ARGV[at + 4])
    if e > t or ce > c then
      redis.call('XADD', KEYS[1], '*', 'e', ARGV[at])
      t, c = math.max(t, e), math.max(c, ce)
    end
  end
  redis.call('HSET', KEYS[7], 't', t, 'c', c)
  if ARGV[4] == '1' then
    local final = ARGV[6 + 5 * (n - 1)]
    redis.call('XADD', KEYS[1], '*', 'e', final)
    redis.call('HSET', KEYS[7], 'f', '1')
    redis.call('ZREM', KEYS[4], ARGV[3])
    if redis.call('EXISTS', KEYS[5]) == 0 then
      redis.call('XADD', KEYS[5], '*', 'e', final)
      redis.call('EXPIRE', KEYS[5], ARGV[2])
    end
    local stages = 6 + 5 * n
    if #ARGV > stages then
      local now = redis.call('TIME')
      local written = now[1] .. '.' .. string.format('%06d', tonumber(now[2]))
      redis.call('HSET', KEYS[6], 'written', written, unpack(ARGV, stages, #ARGV - 1))
      redis.call('EXPIRE', KEYS[6], ARGV[#ARGV])
    end
  end
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[7], ARGV[2])
return redis.call('EXISTS', KEYS[3])
"""


def _script_keys(job_id: str, tenant: str) -> list[str]:
    return [
        keys.job_stream(job_id),
        keys.job_epoch(job_id),
        keys.job_cancel(job_id),
        keys.tenant_jobs(tenant),
        keys.job_end(job_id),
        keys.job_stages(job_id),
        keys.job_written(job_id),
    ]


def _span(event: StreamEvent) -> tuple[int, int, int, int]:
    """(first token index, tokens, first character, characters) of an event; a final spans none."""
    if isinstance(event, TokenDelta):
        return event.start, len(event.token_ids), event.text_start, len(event.text)
    return 0, 0, 0, 0


def _script_args(
    epoch: int | str, ttl_s: int, job_id: str, events: list[StreamEvent], stages: dict[str, float] | None
) -> list[Any]:
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
    script = client.register_script(_FENCED_XADD)
    reply = script(
        keys=_script_keys(job_id, ""), args=_script_args(NO_FENCE, STREAM_TTL_S, job_id, [event], None)
    )
    return bool(check_cancel and int(reply))


class FencedStream:
    """Epoch-checked appends to job streams (the script is registered once per client)."""

    def __init__(self, client: redis.Redis, ttl_s: int = STREAM_TTL_S) -> None:
        self._xadd = client.register_script(_FENCED_XADD)
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
        reply = self._xadd(
            keys=_script_keys(job_id, tenant), args=_script_args(epoch, self.ttl_s, job_id, events, stages)
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
