-- An ended batch's record kept for its retention (the record's `retain_s`; absent or 0: kept).
-- KEYS: the batch's record
local retain_s = tonumber(redis.call('HGET', KEYS[1], 'retain_s') or '0')
if retain_s and retain_s > 0 then redis.call('EXPIRE', KEYS[1], retain_s) end
return retain_s
