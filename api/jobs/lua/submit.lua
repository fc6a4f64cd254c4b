-- A job's submission (api/jobs/submit_write.py: JobWrite builds KEYS and ARGV): its metadata,
-- message copy and pending entry, delivery records and queue message, all or nothing; or, when
-- the dispatch window is full and its tenant has its quota released, parked.
-- KEYS: meta, message copy, pending set, queue, delivery record, the tag's job, INFLIGHT, the
-- tenant's released jobs, PARKED, the tenant's parked jobs, PARKED_TENANTS, the job's parked hash.
-- ARGV: ttl, message, now, job id, payload, delivery record, window (0: none known), quota, class,
-- deadline, rank among the tenant's parked jobs, tenant, delivery tag, delivery queue, then the
-- meta hash's field/value pairs. Returns 1 released, 0 parked.
redis.call('HSET', KEYS[1], unpack(ARGV, 15))
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', ARGV[3])
local interactive = ARGV[9] ~= 'batch'
if interactive then
  redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', ARGV[3])
  local window = tonumber(ARGV[7])
  if window > 0 and redis.call('ZCARD', KEYS[7]) + redis.call('ZCARD', KEYS[9]) >= window
     and redis.call('ZCARD', KEYS[8]) >= tonumber(ARGV[8]) then
    redis.call('HSET', KEYS[12], 'key', KEYS[4], 'payload', ARGV[5], 'tag', ARGV[13], 'queue', ARGV[14],
      'tenant', ARGV[12], 'deadline', ARGV[10], 'ttl', ARGV[1])
    redis.call('EXPIRE', KEYS[12], ARGV[1])
    redis.call('ZADD', KEYS[10], ARGV[11], ARGV[4])
    redis.call('ZADD', KEYS[9], ARGV[3], ARGV[4])
    redis.call('SADD', KEYS[11], ARGV[12])
    return 0
  end
  redis.call('ZADD', KEYS[8], ARGV[10], ARGV[4])
  redis.call('ZADD', KEYS[7], ARGV[10], ARGV[4])
end
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[4])
redis.call('SET', KEYS[5], ARGV[6], 'EX', ARGV[1])
redis.call('SET', KEYS[6], ARGV[4], 'EX', ARGV[1])
redis.call('LPUSH', KEYS[4], ARGV[5])
return 1
