"""Lost messages: kombu's Redis transport pops a message (BRPOP) before it records it as unacked,
so a worker killed between the two loses it, and no reaper or visibility timeout can bring it back.
The api therefore keeps a copy of each job's message (keys.job_message) and lists the job as
pending until a worker starts it (takes its first lease: forget_message). A job pending longer
than the grace, never leased, and found neither on a queue nor among the unacked messages is
sent again under the same task id. A copy too many costs nothing: the lease lets one run, and a
copy of a job that ended answers with its result."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import redis
from celery import Celery

from broker import keys, message_copy

log = logging.getLogger(__name__)
SCAN_LIMIT = 200  # pending jobs looked at per pass


def forget_message(client: redis.Redis, job_id: str) -> None:
    pipe = client.pipeline(transaction=False)
    message_copy.forget(pipe, job_id)
    pipe.execute()


def _message_ids(raws: Any) -> set[str]:
    ids = set()
    for raw in raws:
        try:
            payload = json.loads(raw)
            payload = payload[0] if isinstance(payload, list) else payload  # unacked: [msg, ex, rk]
            ids.add(payload["headers"]["id"])
        except (ValueError, KeyError, TypeError, IndexError):
            continue
    return ids


def _present(client: redis.Redis) -> set[str]:
    """Ids of every job on a kvferry queue or delivered and unacked (one pass, only when needed)."""
    names: Any = client.smembers(keys.WORKERS)
    queues = [keys.SHARED_QUEUE] + [keys.worker_queue(n.decode()) for n in names]
    pipe = client.pipeline(transaction=False)
    for queue in queues:
        pipe.lrange(queue, 0, -1)
    pipe.hvals(keys.KOMBU_UNACKED)
    found: set[str] = set()
    for raws in pipe.execute():
        found |= _message_ids(raws)
    return found


def resend_lost(client: redis.Redis, app: Celery, grace_s: float, now: float | None = None) -> list[str]:
    """Send again the pending jobs whose message is nowhere; returns their ids."""
    now = now or time.time()
    due: Any = client.zrangebyscore(keys.PENDING_JOBS, 0, now - grace_s, start=0, num=SCAN_LIMIT)
    if not due:
        return []
    present: set[str] | None = None
    sent = []
    for raw_id in due:
        job_id = raw_id.decode()
        message: Any = client.get(keys.job_message(job_id))
        if message is None or client.exists(keys.job_epoch(job_id)):
            forget_message(client, job_id)  # started (or expired): nothing to watch
            continue
        if present is None:
            present = _present(client)
        if job_id in present:
            client.zadd(keys.PENDING_JOBS, {job_id: now})  # still waiting its turn: look later
            continue
        doc = json.loads(message)
        queue = doc["queue"] if not doc["queue"].startswith(keys.worker_queue("")) else keys.SHARED_QUEUE
        app.send_task(keys.GENERATE_TASK, args=[doc["job"]], task_id=job_id, queue=queue)
        client.zadd(keys.PENDING_JOBS, {job_id: now})
        sent.append(job_id)
    if sent:
        log.warning("sent again %d job(s) whose message was lost: %s", len(sent), ", ".join(sent))
    return sent
