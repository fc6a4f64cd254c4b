-- KEYS[2]: the record, KEYS[3]: its running hash. ARGV[2]: the cursor the runner read,
-- ARGV[3], ARGV[4]: the cursor after the line (line, offset), ARGV[5]: the line's jobs (JSON; ''
-- for a bad line, counted failed), ARGV[6]: the line's number. 0 if the cursor moved meanwhile.
if redis.call('HGET', KEYS[2], 'cursor_line') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[2], 'cursor_line', ARGV[3], 'cursor_offset', ARGV[4])
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[3], ARGV[6], ARGV[5])
else
  redis.call('HINCRBY', KEYS[2], 'failed', 1)
end
return 1
