-- Shared by every script of the cold tier (kvstore/redis/scripts.py prepends HASH_LEN and CLUSTER).
-- CLUSTER: packs live in other slots than the metadata, so no script touches a pack: drop() lists
-- the packs it drops in `gone`, which the script returns for the client to UNLINK on their shards.
-- KEYS[1..8]: TierKeys.namespace(). Per-owner and per-tenant keys are built from the tier's prefix
-- (the same formats as TierKeys.pinset / TierKeys.owners); they share the fingerprint's hash tag.
local index, lru, bytes_key, packs, blockpins = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local tenant_bytes, owner_bytes, counters = KEYS[6], KEYS[7], KEYS[8]
local NS = 8
local prefix = string.sub(index, 1, #index - 5)  -- index is prefix .. 'index'

local gone = {}

local function pinset(owner) return prefix .. 'pinset:' .. owner end
local function owners_of(tenant) return prefix .. 'owners:' .. tenant end

local function add_bytes(hash, field, delta)
  if delta ~= 0 and redis.call('HINCRBY', hash, field, delta) <= 0 then redis.call('HDEL', hash, field) end
end

local function unpin_block(h)
  if redis.call('HINCRBY', blockpins, h, -1) <= 0 then redis.call('HDEL', blockpins, h) end
end

-- Drop every trace of a pack. Block pins stay: they belong to their owners, not to the pack.
local function drop(pack)
  local meta = redis.call('HGET', packs, pack)
  if meta then
    local sep = string.find(meta, '|', 1, true)
    for i = sep + 1, #meta, HASH_LEN do
      local h = string.sub(meta, i, i + HASH_LEN - 1)
      if redis.call('HGET', index, h) == pack then redis.call('HDEL', index, h) end
    end
    redis.call('DECRBY', bytes_key, tonumber(string.sub(meta, 1, sep - 1)))
  end
  if CLUSTER then gone[#gone + 1] = pack else redis.call('DEL', pack) end
  redis.call('ZREM', lru, pack)
  redis.call('HDEL', packs, pack)
  return meta and 1 or 0
end

local function pinned(pack)
  local meta = redis.call('HGET', packs, pack)
  if not meta then return false end
  local sep = string.find(meta, '|', 1, true)
  for i = sep + 1, #meta, HASH_LEN do
    if redis.call('HEXISTS', blockpins, string.sub(meta, i, i + HASH_LEN - 1)) == 1 then return true end
  end
  return false
end

-- Every pin of one owner goes; returns how many blocks it pinned.
local function release(tenant, owner)
  local set = pinset(owner)
  local members = redis.call('SMEMBERS', set)
  for _, h in ipairs(members) do unpin_block(h) end
  redis.call('DEL', set)
  local held = tonumber(redis.call('HGET', owner_bytes, owner) or '0')
  redis.call('HDEL', owner_bytes, owner)
  redis.call('ZREM', owners_of(tenant), owner)
  add_bytes(tenant_bytes, tenant, -held)
  return #members
end

-- The tenant's least recently pinned owners lose their pins until it is within its quota.
local function enforce_quota(tenant, quota)
  local released = 0
  if quota <= 0 then return 0 end
  while tonumber(redis.call('HGET', tenant_bytes, tenant) or '0') > quota do
    local oldest = redis.call('ZRANGE', owners_of(tenant), 0, 0)
    if #oldest == 0 then redis.call('HDEL', tenant_bytes, tenant) break end
    release(tenant, oldest[1])
    released = released + 1
  end
  return released
end

-- Pinned packs alone are over the cap: an owner loses its pins, never another tenant's for the
-- pinning tenant's sake. First the oldest owner of a tenant over its quota (most over first);
-- else the pinning tenant's own oldest owner (actor); else, when the cap was crossed by a write no
-- tenant made (actor nil), the biggest tenant's oldest. Returns 0 when no owner is left to release.
local function release_for_cap(quota, actor)
  local all = redis.call('HGETALL', tenant_bytes)
  local best, excess = nil, nil
  for i = 1, #all, 2 do
    local over = tonumber(all[i + 1]) - quota
    if best == nil or over > excess then best, excess = all[i], over end
  end
  if best == nil then return 0 end
  if actor and not (quota > 0 and excess > 0) then
    if redis.call('ZCARD', owners_of(actor)) == 0 then return 0 end
    best = actor
  end
  local oldest = redis.call('ZRANGE', owners_of(best), 0, 0)
  if #oldest == 0 then redis.call('HDEL', tenant_bytes, best) return 1 end
  release(best, oldest[1])
  return 1
end

-- The LRU byte cap holds for pinned packs too: unpinned packs go first, oldest first; when only
-- pinned ones are left, whole owners are released (release_for_cap) and the scan starts over.
local function evict(capacity, quota, actor)
  local evicted, skip = 0, 0
  while tonumber(redis.call('GET', bytes_key) or '0') > capacity do
    local oldest = redis.call('ZRANGE', lru, skip, skip)
    if #oldest == 0 then
      if skip == 0 or release_for_cap(quota, actor) == 0 then break end
      skip = 0
    elseif pinned(oldest[1]) then
      skip = skip + 1
    else
      evicted = evicted + drop(oldest[1])
    end
  end
  if evicted > 0 then redis.call('HINCRBY', counters, 'packs_evicted', evicted) end
  return evicted
end
