-- A worker restarted under its old name: drop the lease its previous life held (that process is
-- gone: two live workers never share a name). The epoch stays, so its writes stay fenced.
-- KEYS: lease. ARGV: the worker's owner prefix ("<name>|"), this process's owner.
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner and string.sub(owner, 1, string.len(ARGV[1])) == ARGV[1] and owner ~= ARGV[2] then
  return redis.call('DEL', KEYS[1])
end
return 0
