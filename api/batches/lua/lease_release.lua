-- KEYS[1]: the lease; ARGV[1]: the holder's token. Freed only by its holder.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
