-- The release script (api/dispatch/release.py: Release): queues parked jobs while the window has
-- room, the tenant with the fewest released jobs per unit of weight first (ties: the lowest band,
-- then the first parked), fenced by the dispatcher's lease token.
-- KEYS: the lease, INFLIGHT, PARKED, PARKED_TENANTS, PENDING_JOBS.
-- ARGV: token, now, window, max per run, the hole, then the templates (the hole for the name) of a
-- tenant's released and parked sets, a job's parked hash, message copy, cancel flag, delivery
-- record, a tag's job; then tenant/weight pairs (a tenant not named weighs 1).
-- Returns {released, parked left}, or {-1, 0} when the token is not the lease's.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-1, 0} end
local hole = ARGV[5]
local function key(tpl, x)
  local i = string.find(tpl, hole, 1, true)
  return string.sub(tpl, 1, i - 1) .. x .. string.sub(tpl, i + 1)
end
local T_INFLIGHT, T_PARKED, J_PARKED, J_MESSAGE, J_CANCEL, J_DELIVERY, TAG_JOB =
  ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11], ARGV[12]
local weights = {}
for i = 13, #ARGV, 2 do weights[ARGV[i]] = tonumber(ARGV[i + 1]) end
local now = ARGV[2]
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local room = tonumber(ARGV[3]) - redis.call('ZCARD', KEYS[2])
local budget = tonumber(ARGV[4])
local live, n, w, head = {}, {}, {}, {}
for _, t in ipairs(redis.call('SMEMBERS', KEYS[4])) do
  local first = redis.call('ZRANGE', key(T_PARKED, t), 0, 0, 'WITHSCORES')
  if #first == 0 then
    redis.call('SREM', KEYS[4], t)
  else
    local mine = key(T_INFLIGHT, t)
    redis.call('ZREMRANGEBYSCORE', mine, '-inf', now)
    table.insert(live, t)
    n[t], w[t], head[t] = redis.call('ZCARD', mine), weights[t] or 1, tonumber(first[2])
  end
end
local released = 0
while room > 0 and budget > 0 and #live > 0 do
  local at = 1
  for i = 2, #live do
    local a, b = live[i], live[at]
    local ra, rb = n[a] / w[a], n[b] / w[b]
    if ra < rb or (ra == rb and head[a] < head[b]) then at = i end
  end
  local t = live[at]
  local pk = key(T_PARKED, t)
  local id = redis.call('ZRANGE', pk, 0, 0)[1]
  redis.call('ZREM', pk, id)
  redis.call('ZREM', KEYS[3], id)
  budget = budget - 1
  local jk = key(J_PARKED, id)
  local f = redis.call('HMGET', jk, 'key', 'payload', 'tag', 'queue', 'deadline', 'ttl')
  redis.call('DEL', jk)
  local live_copy = redis.call('EXISTS', key(J_MESSAGE, id)) == 1
  if f[1] and live_copy and redis.call('EXISTS', key(J_CANCEL, id)) == 0 then
    local record = '{"tag": ' .. cjson.encode(f[3]) .. ', "queue": ' .. cjson.encode(f[4])
      .. ', "at": ' .. now .. '}'
    redis.call('ZADD', KEYS[5], now, id)
    redis.call('SET', key(J_DELIVERY, id), record, 'EX', f[6])
    redis.call('SET', key(TAG_JOB, f[3]), id, 'EX', f[6])
    redis.call('LPUSH', f[1], f[2])
    redis.call('ZADD', KEYS[2], f[5], id)
    redis.call('ZADD', key(T_INFLIGHT, t), f[5], id)
    n[t] = n[t] + 1
    room = room - 1
    released = released + 1
  end
  local next = redis.call('ZRANGE', pk, 0, 0, 'WITHSCORES')
  if #next == 0 then
    redis.call('SREM', KEYS[4], t)
    table.remove(live, at)
  else
    head[t] = tonumber(next[2])
  end
end
return {released, redis.call('ZCARD', KEYS[3])}
