-- A worker starting a job, in one round trip (broker/jobs/lease.py: LeaseStart). The job is
-- listed as the worker's (KEYS[3]: the reaper hands it back if the worker dies), the lease is
-- taken and, once it is ours, the queued message's copy and its pending entry go (no copy is
-- needed once a worker started it) and the stream and the cancel flag are read: after the epoch
-- was raised, so no older epoch can append to what was read. A lease this very owner holds is
-- its own take whose reply was lost: taken, at the same epoch.
-- KEYS: lease, epoch, the worker's jobs, message copy, pending jobs, stream, cancel flag.
-- ARGV: owner, lease TTL (ms), epoch TTL (s), job id.
-- Returns {1, owner, epoch, ttl, stream entries, cancelled}, or {0, owner, epoch, pttl} when held.
redis.call('SADD', KEYS[3], ARGV[4])
local owner = redis.call('HGET', KEYS[1], 'owner')
local epoch
if owner == ARGV[1] then
  epoch = tonumber(redis.call('HGET', KEYS[1], 'epoch'))
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
elseif owner then
  return {0, owner, tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0'), redis.call('PTTL', KEYS[1])}
else
  epoch = redis.call('INCR', KEYS[2])
  redis.call('EXPIRE', KEYS[2], ARGV[3])
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'epoch', epoch)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
forget_copy(KEYS[4], KEYS[5], ARGV[4])
return {1, ARGV[1], epoch, tonumber(ARGV[2]), redis.call('XRANGE', KEYS[6], '-', '+'),
        redis.call('EXISTS', KEYS[7])}
