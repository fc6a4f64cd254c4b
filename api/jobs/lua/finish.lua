-- A job's end seen (api/jobs/tenant_jobs.py: Finish): it leaves its tenant's jobs, keys.INFLIGHT
-- and the tenant's released jobs (its dispatch seat is free: api/dispatch/), and its queued
-- message's copy goes (forget_copy, broker/jobs/lua/forget_copy.lua).
-- KEYS: the tenant's jobs, the job's metadata hash, message copy, pending jobs, INFLIGHT, the
-- tenant's released jobs. ARGV: job id.
-- Returns 1 the first time a job's end is seen (its tokens are counted then), else 0. The
-- metadata's TTL is untouched: HSETNX only on a hash that exists.
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1])
forget_copy(KEYS[3], KEYS[4], ARGV[1])
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
return redis.call('HSETNX', KEYS[2], 'accounted', '1')
