-- KEYS[1]: the lease; ARGV[1]: the holder's token, ARGV[2]: the TTL (ms). 1 if still ours.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
