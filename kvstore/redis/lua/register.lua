-- Runs in put's MULTI/EXEC right after a SET NX of each pack, so the bytes never pass through Lua
-- (a script argument is copied twice over). Registers the packs nobody registered yet.
-- KEYS[NS+1..]: pack keys; ARGV[1]: capacity, ARGV[2]: tenant quota, then per pack: member
-- hashes, lru score. Returns {blocks written, bytes written, packs evicted}.
local written, written_bytes = 0, 0
for i = NS + 1, #KEYS do
  local pack, members, score = KEYS[i], ARGV[2 * (i - NS) + 1], ARGV[2 * (i - NS) + 2]
  if redis.call('HEXISTS', packs, pack) == 0 then
    local size = redis.call('STRLEN', pack)
    for j = 1, #members, HASH_LEN do
      redis.call('HSET', index, string.sub(members, j, j + HASH_LEN - 1), pack)
    end
    redis.call('ZADD', lru, score, pack)
    redis.call('HSET', packs, pack, size .. '|' .. members)
    redis.call('INCRBY', bytes_key, size)
    written = written + #members / HASH_LEN
    written_bytes = written_bytes + size
  else
    -- another writer's identical pack: re-index members whose entry went with another pack
    for j = 1, #members, HASH_LEN do
      redis.call('HSETNX', index, string.sub(members, j, j + HASH_LEN - 1), pack)
    end
    redis.call('ZADD', lru, 'XX', score, pack)
  end
end
if written > 0 then
  redis.call('HINCRBY', counters, 'blocks_written', written)
  redis.call('HINCRBY', counters, 'bytes_written', written_bytes)
end
return {written, written_bytes, evict(tonumber(ARGV[1]), tonumber(ARGV[2]))}
