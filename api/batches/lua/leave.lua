-- In front of the runner's fenced scripts: a batch that has ended leaves the runner's list,
-- nothing runs for it any more, its input file is free, and its record is kept for its retention
-- (`retain_s`; 0: kept).
local function leave(active, running, readers, record, batch_id)
  redis.call('ZREM', active, batch_id)
  redis.call('DEL', running)
  redis.call('SREM', readers, batch_id)
  local retain_s = tonumber(redis.call('HGET', record, 'retain_s') or '0')
  if retain_s and retain_s > 0 then redis.call('EXPIRE', record, retain_s) end
end
