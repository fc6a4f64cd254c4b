"""broker/message_copy: the one deletion of a job's message copy and pending entry, queued on a
pipeline or run inside a script, takes both and nothing of another job."""

from __future__ import annotations

import redis

from broker import keys
from broker.jobs import message_copy


def _queue(rds: redis.Redis, *job_ids: str) -> None:
    for job_id in job_ids:
        rds.set(keys.job_message(job_id), b"{}")
        rds.zadd(keys.PENDING_JOBS, {job_id: 1.0})


def _kept(rds: redis.Redis, job_id: str) -> tuple[bool, bool]:
    return bool(rds.exists(keys.job_message(job_id))), rds.zscore(keys.PENDING_JOBS, job_id) is not None


def test_on_a_pipeline_and_in_a_script_both_go_and_only_the_jobs(rds: redis.Redis) -> None:
    _queue(rds, "a", "b", "c")
    pipe = rds.pipeline(transaction=False)
    message_copy.forget(pipe, "a")
    pipe.execute()
    # the job id and the keys at other places than the first, as in the scripts that embed it
    script = rds.register_script(f"{message_copy.forget_lua(2, 2)}\nreturn 1")
    assert script(keys=["unused", *message_copy.copy_keys("b")], args=["unused", "b"]) == 1
    assert (_kept(rds, "a"), _kept(rds, "b"), _kept(rds, "c")) == (
        (False, False),
        (False, False),
        (True, True),
    )
