"""Reaper: hands a dead worker's jobs back to the queues, within seconds of its last heartbeat.

kombu keeps every delivered-but-unacked message in a hash until the worker acks it (late ack);
it restores one only after the visibility timeout, which must outlast the longest job. A worker
whose heartbeat has expired is dead, so its jobs need not wait that long: the reaper moves them
back itself, onto the shared queue when they had been routed to the dead worker's own queue.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import redis

from broker import keys

log = logging.getLogger(__name__)


def _task_id(raw: bytes | str) -> tuple[str | None, dict[str, Any], str, str]:
    payload, exchange, routing_key = json.loads(raw)
    return payload.get("headers", {}).get("id"), payload, exchange, routing_key


def _restore(client: redis.Redis, tag: bytes, dead_queue: str) -> str | None:
    """Move one unacked message back onto a queue, atomically (WATCH: kombu's own sweep may race)."""
    with client.pipeline() as pipe:
        try:
            pipe.watch(keys.KOMBU_UNACKED)
            raw = pipe.hget(keys.KOMBU_UNACKED, tag)
            if raw is None:
                pipe.unwatch()
                return None
            task_id, payload, _, routing_key = _task_id(raw)
            queue = keys.SHARED_QUEUE if routing_key == dead_queue else routing_key
            payload["headers"]["redelivered"] = True
            payload.setdefault("properties", {}).setdefault("delivery_info", {})["redelivered"] = True
            pipe.multi()
            pipe.hdel(keys.KOMBU_UNACKED, tag)
            pipe.zrem(keys.KOMBU_UNACKED_INDEX, tag)
            pipe.rpush(queue, json.dumps(payload))  # the consuming end: redelivered first
            pipe.execute()
            return task_id
        except redis.WatchError:
            return None


def reap(client: redis.Redis, self_name: str) -> list[str]:
    """Release the jobs of every worker whose heartbeat is gone; returns the job ids moved."""
    moved: list[str] = []
    names: Any = client.smembers(keys.WORKERS)
    for raw_name in names:
        name = raw_name.decode()
        if name == self_name or client.exists(keys.worker_heartbeat(name)):
            continue
        if not client.set(keys.REAPER_LOCK, self_name, nx=True, ex=10):
            return moved  # another worker is reaping
        try:
            job_ids = {j.decode() for j in client.smembers(keys.worker_jobs(name))}  # type: ignore[union-attr]
            dead_queue = keys.worker_queue(name)
            if job_ids:
                for tag, raw in client.hscan_iter(keys.KOMBU_UNACKED):
                    if _task_id(raw)[0] in job_ids:
                        task_id = _restore(client, tag, dead_queue)
                        if task_id:
                            moved.append(task_id)
            # Jobs still waiting on the dead worker's own queue go to the shared one.
            while client.lmove(dead_queue, keys.SHARED_QUEUE, "RIGHT", "RIGHT") is not None:
                moved.append("(queued)")
            client.delete(keys.worker_jobs(name))
            client.srem(keys.WORKERS, name)
            if moved:
                log.warning("worker %s is dead: handed back %d job(s)", name, len(moved))
        finally:
            client.delete(keys.REAPER_LOCK)
    return moved
