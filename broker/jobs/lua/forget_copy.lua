-- A queued job's message copy (keys.job_message) and its pending entry (keys.PENDING_JOBS) go:
-- the one deletion of both inside a script (broker/jobs/message_copy.py; on a pipeline: forget()).
local function forget_copy(message_key, pending_key, job_id)
  redis.call('DEL', message_key)
  redis.call('ZREM', pending_key, job_id)
end
