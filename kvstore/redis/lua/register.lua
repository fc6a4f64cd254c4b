-- Runs right after a SET NX of each pack (in put's MULTI/EXEC on one Redis; after the SETs on
-- their shards on a cluster), so the bytes never pass through Lua (a script argument is copied
-- twice over). Registers the packs nobody registered yet.
-- ARGV[1]: capacity, ARGV[2]: tenant quota, then per pack: its key, member hashes, lru score,
-- size (used on a cluster, where the pack is on another shard; one Redis reads STRLEN).
-- Returns {blocks written, bytes written, packs evicted, packs dropped (CLUSTER: to UNLINK)}.
local written, written_bytes = 0, 0
for i = 3, #ARGV, 4 do
  local pack, members, score = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if redis.call('HEXISTS', packs, pack) == 0 then
    local size = CLUSTER and tonumber(ARGV[i + 3]) or redis.call('STRLEN', pack)
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
local evicted = evict(tonumber(ARGV[1]), tonumber(ARGV[2]))
return {written, written_bytes, evicted, gone}
