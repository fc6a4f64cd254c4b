-- Give the lease back if it is still this owner's at this epoch. KEYS: lease. ARGV: owner, epoch.
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] and redis.call('HGET', KEYS[1], 'epoch') == ARGV[2] then
  return redis.call('DEL', KEYS[1])
end
return 0
