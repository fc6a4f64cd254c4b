-- KEYS[2]: the active list, KEYS[3]: the batch's running hash, KEYS[4]: its input file's readers,
-- KEYS[5]: its record; ARGV[2]: the batch id (lua/leave.lua).
leave(KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[2])
return 1
