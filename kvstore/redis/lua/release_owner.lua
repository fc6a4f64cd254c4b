-- Release every pin of the owners named: ARGV pairs of (tenant, owner id). Returns blocks unpinned.
-- No eviction here: releasing never adds bytes, and the next put evicts what has become evictable.
local unpinned = 0
for i = 1, #ARGV, 2 do unpinned = unpinned + release(ARGV[i], ARGV[i + 1]) end
return unpinned
