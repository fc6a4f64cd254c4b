-- KEYS[1]: the runner's lease, KEYS[2]: its epoch counter; ARGV[1]: the api, ARGV[2]: the TTL (ms).
-- The lease's new token "<epoch>|<api>" if it was free, else false.
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local token = redis.call('INCR', KEYS[2]) .. '|' .. ARGV[1]
redis.call('SET', KEYS[1], token, 'PX', ARGV[2])
return token
