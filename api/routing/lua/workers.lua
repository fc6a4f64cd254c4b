-- Every announced worker with its heartbeat, in one round trip (not SMEMBERS, then the HGETs):
-- api/routing/fleet.py. KEYS: keys.WORKERS. ARGV: the heartbeat key's prefix and suffix (around
-- the worker's name), the heartbeat's field. Returns name, heartbeat (or false), name, ...
local out = {}
for _, name in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  table.insert(out, name)
  table.insert(out, redis.call('HGET', ARGV[1] .. name .. ARGV[2], ARGV[3]))
end
return out
