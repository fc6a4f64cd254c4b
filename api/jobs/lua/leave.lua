-- A cancelled job leaves fair dispatch's sets at once (api/jobs/leave.py: Leave).
-- KEYS: PARKED, INFLIGHT, the job's parked hash, its metadata. ARGV: job id, the tenant's parked
-- and released key templates, the hole in them where the tenant goes.
local function key(tpl, x)
  local i = string.find(tpl, ARGV[4], 1, true)
  return string.sub(tpl, 1, i - 1) .. x .. string.sub(tpl, i + 1)
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
local parked = redis.call('HGET', KEYS[3], 'tenant')
if parked then
  redis.call('ZREM', key(ARGV[2], parked), ARGV[1])
  redis.call('DEL', KEYS[3])
end
local tenant = redis.call('HGET', KEYS[4], 'tenant')
if tenant then redis.call('ZREM', key(ARGV[3], tenant), ARGV[1]) end
return 1
