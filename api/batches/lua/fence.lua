-- In front of every runner write (and alone, lua/check.lua: before a part file is appended to). KEYS[1]: the runner's lease, ARGV[1]: the runner's token
-- ("<epoch>|<api>"): a runner whose lease lapsed (another took it since, with a higher epoch)
-- writes nothing, and learns it (-1).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
