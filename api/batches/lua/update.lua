-- KEYS[2]: the record; ARGV[2..]: field, value pairs. Never brings a deleted record back (0).
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
for i = 2, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
return 1
