-- Renew ours; re-take it if it lapsed while nobody else took it (the epoch is still ours), so a
-- Redis hiccup longer than the TTL costs nothing. Anything else: the lease is lost (0).
-- KEYS: lease, epoch. ARGV: owner, epoch, lease TTL (ms).
local owner = redis.call('HGET', KEYS[1], 'owner')
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
if current ~= tonumber(ARGV[2]) then return 0 end
if owner and owner ~= ARGV[1] then return 0 end
if not owner then redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'epoch', ARGV[2]) end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
