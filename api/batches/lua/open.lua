-- A new batch counted among its tenant's open batches, unless it would pass the tenant's cap.
-- The caller writes the batch's record after this script admits it.
-- KEYS: the tenant's open batches (ZSET id -> when admitted)
-- ARGV: batch id, now (unix seconds), max open batches (0: no cap), batch record key prefix and
--       suffix (a record's key is prefix .. id .. suffix), then the ended statuses
-- Returns the tenant's open batches before this one, negated when refused (-count - 1).
local id, now, max_open, prefix, suffix = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5]
local ended = {}
for i = 6, #ARGV do ended[ARGV[i]] = true end

-- A batch that has ended leaves the set here; so does one whose record is gone (its retention
-- ran out, or its create failed) unless it was admitted just now (its record not yet written).
local open = 0
local members = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #members, 2 do
  local other = members[i]
  local status = redis.call('HGET', prefix .. other .. suffix, 'status')
  if (status and ended[status]) or (not status and tonumber(members[i + 1]) < now - 60) then
    redis.call('ZREM', KEYS[1], other)
  else
    open = open + 1
  end
end
if max_open > 0 and open >= max_open then return -open - 1 end
redis.call('ZADD', KEYS[1], now, id)
return open
