-- KEYS[2]: the active list, KEYS[3]: the batch's running hash, KEYS[4]: its input file's readers;
-- ARGV[2]: the batch id. Out of the runner's list; nothing runs for it; its input is free.
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('DEL', KEYS[3])
redis.call('SREM', KEYS[4], ARGV[2])
return 1
