-- Save a session's record, newer wins (broker/sessions/store.py: SessionSave). Two turns of one
-- session may finish in either order on two workers; the record of the turn that finished last
-- (last_used) stays, as its pins do (kvstore/redis/lua/pin_owner.lua). A turn that began before
-- the session was deleted does not bring it back. The old record is parsed as JSON (whatever its
-- layout); one that does not parse is replaced.
-- KEYS: record, expiry zset, tombstone, exact tokens.
-- ARGV: json, last_used, ttl with grace, member, expires at, when the turn began, the tokens'
-- blob ('' = none: the old one goes). Returns 1 saved, 0 refused.
local deleted = redis.call('GET', KEYS[3])
if deleted and tonumber(deleted) >= tonumber(ARGV[6]) then return 0 end
local old = redis.call('GET', KEYS[1])
if old then
  local ok, doc = pcall(cjson.decode, old)
  local last = ok and type(doc) == 'table' and tonumber(doc['last_used']) or nil
  if last and last > tonumber(ARGV[2]) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[4])
if ARGV[7] ~= '' then redis.call('SET', KEYS[4], ARGV[7], 'EX', ARGV[3]) else redis.call('DEL', KEYS[4]) end
return 1
