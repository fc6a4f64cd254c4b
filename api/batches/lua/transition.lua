-- KEYS[2]: the batch's record. ARGV[2]: the status to set, ARGV[3]: its time field, ARGV[4]: now,
-- ARGV[5..]: the statuses it may come from. 1 if set, 0 if the batch is in none of them.
local status = redis.call('HGET', KEYS[2], 'status')
if not status then return 0 end
for i = 5, #ARGV do
  if ARGV[i] == status then
    redis.call('HSET', KEYS[2], 'status', ARGV[2], ARGV[3], ARGV[4])
    return 1
  end
end
return 0
