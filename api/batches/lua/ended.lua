-- KEYS[2]: the active list, KEYS[3]: the batch's running hash, KEYS[4]: its input file's readers;
-- KEYS[5]: its record; ARGV[2]: the batch id. Out of the runner's list; nothing runs for it; its
-- input is free; its record kept for its retention (`retain_s`; 0: kept).
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('DEL', KEYS[3])
redis.call('SREM', KEYS[4], ARGV[2])
local retain_s = tonumber(redis.call('HGET', KEYS[5], 'retain_s') or '0')
if retain_s and retain_s > 0 then redis.call('EXPIRE', KEYS[5], retain_s) end
return 1
