"""Reaper: hands a dead worker's jobs back to the queues, within seconds of its last heartbeat.

kombu keeps every delivered-but-unacked message in a hash until the worker acks it (late ack);
it restores one only after the visibility timeout, which must outlast the longest job. A worker
whose heartbeat has expired is dead, so its jobs need not wait that long: the reaper moves them
back itself, onto the shared queue when they had been routed to the dead worker's own queue.
A job is handed back only once its lease has lapsed (broker/jobs/lease.py): a worker whose
heartbeat merely went missing still renews its leases, and its jobs stay where they are.

Only the fleet's sweeper runs the reaper and the orphan sweep (workers/jobs/maintenance.py).
Neither parses a payload to find a job: the unacked messages are read by tag, through their
small records (workers/jobs/unacked.py); a payload is parsed only to move its message back.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import time
from typing import Any

import redis

from broker import keys, priority
from broker.jobs.lease import JobLeases
from workers.jobs import unacked

log = logging.getLogger(__name__)
SWEEP_LIMIT = 1000  # old unacked messages looked at per pass (the oldest first)


def _restore_jobs(client: redis.Redis, job_ids: set[str], dead_queue: str) -> list[str]:
    moved: list[str] = []
    for tag in unacked.tags_of_jobs(client, job_ids):
        try:
            task_id = unacked.restore(client, tag, dead_queue)
        except ValueError as exc:  # unreachable for a tag classified as a job; never stops the rest
            log.warning("unacked message %s cannot be handed back: %s", tag, exc)
            continue
        if task_id:
            moved.append(task_id)
    return moved


def _release(client: redis.Redis, name: str) -> tuple[list[str], int]:
    """Hand back the jobs of dead worker `name` whose leases have lapsed; returns the ids moved
    and how many are still leased (a lease outlives its holder by at most its TTL)."""
    leases = JobLeases(client, ttl_s=1.0)
    job_ids = {j.decode() for j in client.smembers(keys.worker_jobs(name))}  # type: ignore[union-attr]
    ready = set()
    for job_id in job_ids:
        holder = leases.holder(job_id)
        if holder is None or holder.worker != name:  # lapsed, or another worker took it over
            ready.add(job_id)
    dead_queue = keys.worker_queue(name)
    moved = _restore_jobs(client, ready, dead_queue)
    if ready:
        client.srem(keys.worker_jobs(name), *ready)
    moved.extend(["(queued)"] * move_queued(client, name))
    return moved, len(job_ids - ready)


def move_queued(client: redis.Redis, name: str) -> int:
    """Move the jobs still waiting on worker `name`'s own queue to the shared one, each in its band
    and in order (a dead worker's, or a draining one's: workers/process/drain.py); how many moved."""
    moved = 0
    for band in priority.PRIORITY_STEPS:
        source = priority.queue_key(keys.worker_queue(name), band)
        target = priority.queue_key(keys.SHARED_QUEUE, band)
        while client.lmove(source, target, "RIGHT", "RIGHT") is not None:
            moved += 1
    return moved


def release_own(client: redis.Redis, name: str, owner: str) -> list[str]:
    """At start, before consuming: hand back at once the jobs this worker name held in its
    previous life (a restart under the same name), dropping that life's leases; the restored
    copies resume from their streams under new epochs. Its own queue stays as it is."""
    leases = JobLeases(client, ttl_s=1.0)
    job_ids = {j.decode() for j in client.smembers(keys.worker_jobs(name))}  # type: ignore[union-attr]
    for job_id in job_ids:
        leases.drop_previous(job_id, name, owner)
    moved = _restore_jobs(client, job_ids, keys.worker_queue(name))
    client.delete(keys.worker_jobs(name))
    if moved:
        log.warning("restarted as %s: handed back %d job(s) of the previous process", name, len(moved))
    return moved


def sweep_orphans(
    client: redis.Redis,
    grace_s: float,
    now: float | None = None,
    counts: collections.Counter[str] | None = None,
) -> tuple[list[str], int]:
    """Unacked messages that nobody runs: delivered more than grace_s ago, no live lease, no final
    event. No job set names them when their worker lost its broker connection before it could
    requeue or ack, or was killed during a clean shutdown; without this they would wait for the
    visibility timeout. They go back to the shared queue (an extra copy is harmless: the lease lets
    one run). A job that ended has its leftover message dropped: the ack its worker could not send.
    No payload is parsed, but to move a message back: the tags' records (workers/jobs/unacked.py),
    then EXISTS of each job's lease and end, in two round trips. Each entry fails alone (logged,
    counted in `counts`). Returns (job ids restored, leftovers dropped)."""
    counts = counts if counts is not None else collections.Counter()
    restored: list[str] = []
    dropped = 0
    cutoff = (now or time.time()) - grace_s
    raw_tags: Any = client.zrangebyscore(keys.KOMBU_UNACKED_INDEX, 0, cutoff, start=0, num=SWEEP_LIMIT)
    tags = [t.decode() if isinstance(t, bytes) else t for t in raw_tags]
    jobs = [(tag, job) for tag, job in unacked.job_ids(client, tags, counts).items() if job]
    pipe = client.pipeline(transaction=False)
    for _, job_id in jobs:
        pipe.exists(keys.job_end(job_id))
        pipe.exists(keys.job_lease(job_id))
    states = pipe.execute() if jobs else []
    for i, (tag, job_id) in enumerate(jobs):
        ended, leased = states[2 * i], states[2 * i + 1]
        try:
            if ended:
                unacked.drop(client, tag)
                dropped += 1
            elif not leased:
                raw: Any = client.hget(keys.KOMBU_UNACKED, tag)
                if raw is None:
                    continue
                # a worker's own queue may have no consumer any more: those go to the shared one
                routing_key = unacked.parse_entry(raw)[2]
                worker_queue = routing_key if routing_key.startswith(keys.worker_queue("")) else ""
                if unacked.restore(client, tag, dead_queue=worker_queue):
                    restored.append(job_id)
        except ValueError as exc:
            counts["malformed_entries"] += 1
            log.warning("orphan sweep: unacked message %s skipped: %s", tag, exc)
    if restored:
        log.warning("handed back %d orphaned job(s): %s", len(restored), ", ".join(restored))
    return restored, dropped


def reap(client: redis.Redis, self_name: str) -> list[str]:
    """Release the jobs of every worker whose heartbeat is gone; returns the job ids moved. The
    heartbeats are read in one round trip (a pipeline of EXISTS)."""
    moved: list[str] = []
    names = sorted(n.decode() for n in client.smembers(keys.WORKERS))  # type: ignore[union-attr]
    names = [n for n in names if n != self_name]
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.exists(keys.worker_heartbeat(name))
    dead = [n for n, alive in zip(names, pipe.execute() if names else [], strict=True) if not alive]
    for name in dead:
        # redis-py's Lock: token-checked release, so a slow reaper never frees another's lock
        lock = client.lock(keys.REAPER_LOCK, timeout=10, blocking=False)
        if not lock.acquire(blocking=False):
            return moved  # another worker is reaping
        try:
            if client.exists(keys.worker_heartbeat(name)):
                continue  # it came back while we took the lock
            released, still_leased = _release(client, name)
            if not still_leased:
                client.srem(keys.WORKERS, name)
            if released:
                log.warning("worker %s is dead: handed back %d job(s)", name, len(released))
            moved.extend(released)
        finally:
            with contextlib.suppress(redis.exceptions.LockError):
                lock.release()
    return moved
