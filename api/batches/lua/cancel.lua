-- A client's cancel (no fence: not a runner's write). KEYS[1]: the batch's record; ARGV[1]: now.
-- validating or in_progress -> cancelling; 1 if set.
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'validating' or status == 'in_progress' then
  redis.call('HSET', KEYS[1], 'status', 'cancelling', 'cancelling_at', ARGV[1])
  return 1
end
return 0
