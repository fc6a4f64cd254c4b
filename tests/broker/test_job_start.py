"""JobLeases.start: a worker lists the job, takes its lease, drops the message copy and reads the
stream and the cancel flag in one atomic round trip; what it reads is what progress() reads."""

from __future__ import annotations

import redis

from broker import keys
from broker.jobs import events as job_events
from broker.jobs.lease import JobLeases, LeaseHolder, Started, make_owner
from broker.messages import TokenDelta

WORKER_JOBS = keys.worker_jobs("w1@h")


def _queued(rds: redis.Redis, job_id: str) -> None:
    """What the api leaves for a queued job: the message's copy and its pending entry."""
    rds.set(keys.job_message(job_id), b"{}")
    rds.zadd(keys.PENDING_JOBS, {job_id: 1.0})


def test_a_fresh_job_is_started_in_one_call(rds: redis.Redis) -> None:
    leases = JobLeases(rds, ttl_s=30)
    _queued(rds, "j1")
    got = leases.start("j1", make_owner("w1@h", "p"), WORKER_JOBS)
    assert isinstance(got, Started)
    assert got.lease.epoch == 1 and got.entries == [] and not got.cancelled
    assert rds.sismember(WORKER_JOBS, "j1")
    assert not rds.exists(keys.job_message("j1")) and rds.zscore(keys.PENDING_JOBS, "j1") is None
    assert rds.ttl(keys.job_lease("j1")) > 0


def test_a_resumed_job_reads_its_stream_and_cancel_flag(rds: redis.Redis) -> None:
    leases = JobLeases(rds, ttl_s=30)
    first = leases.start("j2", make_owner("w0@h", "p"), keys.worker_jobs("w0@h"))
    assert isinstance(first, Started)
    for i, piece in enumerate(("Hel", "lo")):
        job_events.publish(rds, "j2", TokenDelta(piece, (i,), start=i, epoch=1))
    rds.delete(keys.job_lease("j2"))  # its worker died, its lease lapsed
    rds.set(keys.job_cancel("j2"), b"1")
    got = leases.start("j2", make_owner("w1@h", "p"), WORKER_JOBS)
    assert isinstance(got, Started) and got.lease.epoch == 2 and got.cancelled
    assert job_events.progress_of(got.entries) == job_events.progress(rds, "j2")
    assert job_events.progress_of(got.entries).token_ids == (0, 1)


def test_a_held_lease_is_not_taken_and_nothing_is_dropped_but_the_copy(rds: redis.Redis) -> None:
    leases = JobLeases(rds, ttl_s=30)
    holder = make_owner("w0@h", "p")
    assert isinstance(leases.start("j3", holder, keys.worker_jobs("w0@h")), Started)
    _queued(rds, "j3")  # a copy redelivered while the first runs
    got = leases.start("j3", make_owner("w1@h", "p"), WORKER_JOBS)
    assert isinstance(got, LeaseHolder) and got.owner == holder and got.epoch == 1
    assert rds.get(keys.job_epoch("j3")) == b"1"  # no epoch raised: nobody fenced
    assert rds.sismember(WORKER_JOBS, "j3")  # listed: the reaper hands it back if w1 dies waiting
    assert rds.exists(keys.job_message("j3"))  # the copy stays while the job runs elsewhere


def test_its_own_lease_is_taken_again_at_the_same_epoch(rds: redis.Redis) -> None:
    """A start whose reply was lost (the client retries): the retry finds this owner's lease and
    takes it as its own, without raising the epoch or waiting out its own lease."""
    leases = JobLeases(rds, ttl_s=30)
    owner = make_owner("w1@h", "p")
    first = leases.start("j4", owner, WORKER_JOBS)
    job_events.publish(rds, "j4", TokenDelta("Hi", (5,), start=0, epoch=1))
    again = leases.start("j4", owner, WORKER_JOBS)
    assert isinstance(first, Started) and isinstance(again, Started)
    assert again.lease == first.lease and rds.get(keys.job_epoch("j4")) == b"1"
    assert job_events.progress_of(again.entries).token_ids == (5,)
    other = leases.start("j4", make_owner("w1@h", "a later life"), WORKER_JOBS)
    assert isinstance(other, LeaseHolder) and other.owner == owner
