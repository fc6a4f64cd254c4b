-- Append a run of events to a job's stream, fenced by the lease epoch and idempotent by token
-- index (broker/jobs/stream_append.py builds KEYS and ARGV: StreamAppend).
-- KEYS: stream, epoch, cancel flag, the tenant's job set, end stream, stage-times hash,
-- keys.job_written (t: next token index, c: next text character, f: 1 once its final event is
-- in), keys.INFLIGHT, the tenant's released jobs (the final frees the job's dispatch seat).
-- ARGV: epoch (or '-': no fence), stream TTL, job id, final ('1': the last event ends the job),
-- n, then n groups of 5 (encoded event, its first token index, tokens, first character,
-- characters; an index -1: right after what is held), then stage name/time pairs (final only;
-- Redis' own clock adds "written"), stages TTL last.
-- Returns -1 when the epoch is not current (nothing written), else whether the job is cancelled.
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
