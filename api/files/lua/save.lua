-- A file's record written, listed under its tenant and counted in its quotas, atomically; or
-- nothing written when the tenant's files would pass a quota.
-- KEYS: record, the tenant's files (ZSET), the tenant's file sizes (HASH)
-- ARGV: file id, list score, bytes, max files (0: no cap), max bytes (0: no cap),
--       expires at (unix seconds; 0: never), record key prefix and suffix (a record's key is
--       prefix .. id .. suffix), "1" to write ("0": only check, before an upload is read), then
--       the record's field/value pairs
-- Returns "" when saved (or, checking, when it could be), else the quota it would pass:
-- "files" or "bytes".
local id, bytes = ARGV[1], tonumber(ARGV[3])
local max_files, max_bytes = tonumber(ARGV[4]), tonumber(ARGV[5])
local expires_at, prefix, suffix = tonumber(ARGV[6]), ARGV[7], ARGV[8]

-- A file whose record is gone (expired, so Redis dropped it) leaves the tenant's lists here.
local sizes = redis.call('HGETALL', KEYS[3])
local files, total = 0, 0
for i = 1, #sizes, 2 do
  local other = sizes[i]
  if redis.call('EXISTS', prefix .. other .. suffix) == 0 then
    redis.call('HDEL', KEYS[3], other)
    redis.call('ZREM', KEYS[2], other)
  elseif other ~= id then -- the file being saved again (a batch's output rewritten) counts once
    files = files + 1
    total = total + tonumber(sizes[i + 1])
  end
end
if max_files > 0 and files + 1 > max_files then return 'files' end
if max_bytes > 0 and total + bytes > max_bytes then return 'bytes' end
if ARGV[9] ~= '1' then return '' end

redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 10))
if expires_at > 0 then redis.call('EXPIREAT', KEYS[1], expires_at) end
redis.call('ZADD', KEYS[2], ARGV[2], id)
redis.call('HSET', KEYS[3], id, bytes)
return ''
