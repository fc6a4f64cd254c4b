-- A tenant's new job against its cap (api/jobs/tenant_jobs.py: Admit). Entries past their
-- deadline are pruned first. KEYS: the tenant's jobs (zset). ARGV: now, deadline, job id, cap
-- (0: none). Returns 1 admitted, 0 full.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local cap = tonumber(ARGV[4])
if cap > 0 and redis.call('ZCARD', KEYS[1]) >= cap then return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
local last = redis.call('ZREVRANGE', KEYS[1], 0, 0, 'WITHSCORES')
redis.call('EXPIREAT', KEYS[1], math.ceil(tonumber(last[2])) + 1)
return 1
