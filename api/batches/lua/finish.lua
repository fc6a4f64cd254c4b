-- Ending a batch, once: its output and error files registered and named in its record, its counts
-- and status set, and it leaves the active list, all or nothing. A batch already out of the
-- statuses it may end from (ended by another runner, or cancelled meanwhile) is left as it is (0):
-- a second finalize changes nothing.
-- KEYS[2]: the record, [3]: the active list, [4]: its running hash, [5]: its input's readers,
-- [6]: the tenant's files, [7]: the output file's record, [8]: the error file's record, [9]: the
-- tenant's file sizes (its quotas). A file record with an `expires_at` gets it as its TTL, and the
-- ended batch's record its retention (`retain_s`).
-- ARGV[2]: the end status, [3]: its time field, [4]: now, [5]: the batch id, [6]: the output
-- file id, [7]: the error file id ('' for none), [8]: completed, [9]: failed, [10]: the errors
-- (JSON; '' keeps them), [11], [12]: the two file records (JSON objects; '' for none), [13]: their
-- score in the tenant's files, [14..]: the statuses it may end from.
local status = redis.call('HGET', KEYS[2], 'status')
if not status then return 0 end
local may = false
for i = 14, #ARGV do
  if ARGV[i] == status then may = true end
end
if not may then return 0 end
for k, at in pairs({[7] = 11, [8] = 12}) do
  if ARGV[at] ~= '' then
    local rec = cjson.decode(ARGV[at])
    redis.call('DEL', KEYS[k])
    for field, value in pairs(rec) do
      redis.call('HSET', KEYS[k], field, tostring(value))
    end
    redis.call('ZADD', KEYS[6], ARGV[13], rec['id'])
    redis.call('HSET', KEYS[9], rec['id'], rec['bytes'])
    local expires_at = tonumber(rec['expires_at'] or '0')
    if expires_at and expires_at > 0 then redis.call('EXPIREAT', KEYS[k], expires_at) end
  end
end
redis.call('HSET', KEYS[2], 'status', ARGV[2], ARGV[3], ARGV[4], 'output_file_id', ARGV[6],
  'error_file_id', ARGV[7], 'completed', ARGV[8], 'failed', ARGV[9])
if ARGV[10] ~= '' then redis.call('HSET', KEYS[2], 'errors', ARGV[10]) end
leave(KEYS[3], KEYS[4], KEYS[5], KEYS[2], ARGV[5])
return 1
