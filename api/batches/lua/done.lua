-- KEYS[2]: the record, KEYS[3]: its running hash. ARGV[2]: the line, ARGV[3]: the count to raise
-- ("completed" or "failed"). 1 if counted, 0 if the line was done already.
if redis.call('HDEL', KEYS[3], ARGV[2]) == 1 then
  redis.call('HINCRBY', KEYS[2], ARGV[3], 1)
  return 1
end
return 0
