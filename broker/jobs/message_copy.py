"""A queued job's message copy (keys.job_message) and its entry among the pending jobs
(keys.PENDING_JOBS): the api writes both when it queues the job, and both go once no copy is needed,
when a worker starts the job or it ends or is cancelled (workers/jobs/lost_messages.py). The deletion is
defined here only: queued on a pipeline (sync or asyncio), or inside a script as lua/forget_copy.lua's
forget_copy(message_key, pending_key, job_id) (a prelude: FORGET_COPY)."""

from __future__ import annotations

from pathlib import Path

import redis
import redis.asyncio as aioredis

from broker import keys

FORGET_COPY = Path(__file__).with_name("lua") / "forget_copy.lua"  # a prelude (broker/redis/lua.py)


def copy_keys(job_id: str) -> list[str]:
    """The two keys, in the order forget_copy takes them (and forget_lua reads them)."""
    return [keys.job_message(job_id), keys.PENDING_JOBS]


def forget(pipe: redis.client.Pipeline | aioredis.client.Pipeline, job_id: str) -> None:
    """Queue the deletion on `pipe` (it runs with the pipeline's other commands)."""
    message, pending = copy_keys(job_id)
    pipe.delete(message)
    pipe.zrem(pending, job_id)


def forget_lua(first_key: int, job_id_arg: int) -> str:
    """The deletion as the text of a script whose KEYS[first_key], KEYS[first_key + 1] are
    copy_keys(job_id) and whose ARGV[job_id_arg] is the job id (a script run by the wrapper names
    FORGET_COPY as a prelude instead)."""
    call = f"forget_copy(KEYS[{first_key}], KEYS[{first_key + 1}], ARGV[{job_id_arg}])"
    return f"{FORGET_COPY.read_text(encoding='utf-8')}{call}"
