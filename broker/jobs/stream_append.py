"""The one Lua script that appends to a job's event stream, fenced by the lease epoch and
idempotent by token index (broker/jobs/events.py's FencedStream runs it), and its arguments."""

from __future__ import annotations

from typing import Any

from broker import keys
from broker.codec import encode_event
from broker.messages import JobDone, JobFailed, StreamEvent, TokenDelta

STAGES_TTL_S = 3600  # a job's stage times are read right after it ends (`bench queue`), or never
NO_FENCE = "-"  # the epoch argument of producers without leases (test doubles, tools)

# One round trip appends a run of events (the last token delta and the final event ride together).
# KEYS: stream, epoch, cancel flag, the tenant's job set, end stream, stage-times hash,
# keys.job_written: how far the stream goes (t: next token index, c: next text character, f: 1
# once its final event is in), then keys.INFLIGHT and the tenant's released jobs (the final frees
# the job's seat in the api's dispatch window: api/dispatch/).
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
FENCED_XADD = """
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
    redis.call('ZREM', KEYS[8], ARGV[3])
    redis.call('ZREM', KEYS[9], ARGV[3])
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


def script_keys(job_id: str, tenant: str) -> list[str]:
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
