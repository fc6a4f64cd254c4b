-- ARGV[1]: how many corrupt packs follow, to drop; then (block hash, pack key) pairs of index
-- entries naming a pack that was missing (evicted by Redis itself, or deleted by hand): its
-- traces go unless it is back (CLUSTER: the client checked, on the pack's shard, that it is gone).
-- Returns {packs dropped, packs dropped (CLUSTER: to UNLINK)}.
local dropped, corrupt = 0, tonumber(ARGV[1])
for i = 2, corrupt + 1 do dropped = dropped + drop(ARGV[i]) end
for i = corrupt + 2, #ARGV, 2 do
  local block_hash, pack = ARGV[i], ARGV[i + 1]
  if CLUSTER or redis.call('EXISTS', pack) == 0 then
    drop(pack)
    if redis.call('HGET', index, block_hash) == pack then redis.call('HDEL', index, block_hash) end
  end
end
return {dropped, gone}
