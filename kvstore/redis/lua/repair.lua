-- KEYS[NS+1..]: corrupt packs to drop; ARGV: (block hash, pack key) pairs of index entries naming a
-- pack that was missing (evicted by Redis itself, or deleted by hand): its traces go unless it is
-- back. Returns packs dropped.
local dropped = 0
for i = NS + 1, #KEYS do dropped = dropped + drop(KEYS[i]) end
for i = 1, #ARGV, 2 do
  local block_hash, pack = ARGV[i], ARGV[i + 1]
  if redis.call('EXISTS', pack) == 0 then
    drop(pack)
    if redis.call('HGET', index, block_hash) == pack then redis.call('HDEL', index, block_hash) end
  end
end
return dropped
