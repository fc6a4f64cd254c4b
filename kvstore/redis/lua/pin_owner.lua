-- Make an owner's pins what ARGV lists (replace) or add them (not replace), atomically: two turns
-- of one session can race, and each diff is against the set as it is now, so nothing leaks.
-- ARGV: tenant, owner id, version (the turn's time: an older turn never overwrites a newer one's
-- pins), block bytes, capacity, tenant quota, replace (1/0), block hashes...
-- Only blocks the index holds are pinned. Returns {added, removed, owners released, packs
-- evicted, 1 if refused as stale, packs dropped (CLUSTER: to UNLINK)}.
local tenant, owner, version = ARGV[1], ARGV[2], tonumber(ARGV[3])
local block_bytes, capacity, quota = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local replace = ARGV[7] == '1'
local owners = owners_of(tenant)
local last = redis.call('ZSCORE', owners, owner)
if last and tonumber(last) > version then return {0, 0, 0, 0, 1, gone} end
local set = pinset(owner)
local want, added, removed = {}, 0, 0
for i = 8, #ARGV do
  if redis.call('HEXISTS', index, ARGV[i]) == 1 then want[ARGV[i]] = true end
end
if replace then
  for _, h in ipairs(redis.call('SMEMBERS', set)) do
    if not want[h] then
      redis.call('SREM', set, h)
      unpin_block(h)
      removed = removed + 1
    end
  end
end
for h, _ in pairs(want) do
  if redis.call('SADD', set, h) == 1 then
    redis.call('HINCRBY', blockpins, h, 1)
    added = added + 1
  end
end
local delta = (added - removed) * block_bytes
add_bytes(owner_bytes, owner, delta)
add_bytes(tenant_bytes, tenant, delta)
if redis.call('EXISTS', set) == 1 then
  redis.call('ZADD', owners, version, owner)
else
  redis.call('ZREM', owners, owner)
end
local released = enforce_quota(tenant, quota)
local evicted = evict(capacity, quota, tenant)
return {added, removed, released, evicted, 0, gone}
