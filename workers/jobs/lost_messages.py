"""Lost messages: kombu's Redis transport pops a message (BRPOP) before it records it as unacked,
so a worker killed between the two loses it, and no reaper or visibility timeout can bring it back.
The api therefore keeps a copy of each job's message (keys.job_message) and lists the job as
pending until a worker starts it (takes its first lease: forget_message). A job pending longer
than the grace, never leased, neither among the unacked messages nor possibly still on its queue
is sent again under the same task id. A copy too many costs nothing: the lease lets one run, and a
copy of a job that ended answers with its result.

Where the job is, is found in O(1) per overdue job, whatever the backlog or the number of workers,
from its delivery record (broker/jobs/delivery.py): among the unacked by its tag (HEXISTS), and
off its list (its queue's list for its priority band, broker/priority.py) once the list is empty or
a worker started a job from it submitted after this one (QUEUES_STARTED: each band list is first
in, first out). No queue and no payload is read. A job still queued is looked at again a grace
later. A job sent again goes to its own band. Only the fleet's sweeper runs it
(workers/jobs/maintenance.py).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import redis
from celery import Celery

from broker import keys, priority
from broker.defaults import DEFAULTS
from broker.jobs import delivery, message_copy
from broker.task_message import task_message

log = logging.getLogger(__name__)
SCAN_LIMIT = 200  # pending jobs looked at per pass


def forget_message(client: redis.Redis, job_id: str) -> None:
    pipe = client.pipeline(transaction=False)
    message_copy.forget(pipe, job_id)
    pipe.execute()


def _where(client: redis.Redis, records: dict[str, delivery.Delivery]) -> set[str]:
    """The jobs among `records` that may still be waiting: unacked, or possibly still queued."""
    pipe = client.pipeline(transaction=False)
    queues = sorted({d.queue for d in records.values()})
    for queue in queues:
        pipe.llen(queue)
        pipe.zscore(keys.QUEUES_STARTED, queue)
    for d in records.values():
        pipe.hexists(keys.KOMBU_UNACKED, d.tag)
    replies = pipe.execute()
    depth = {q: int(replies[2 * i]) for i, q in enumerate(queues)}
    started = {q: replies[2 * i + 1] for i, q in enumerate(queues)}
    waiting = set()
    for (job_id, d), in_unacked in zip(records.items(), replies[2 * len(queues) :], strict=True):
        if in_unacked or not delivery.popped(d, depth[d.queue], started[d.queue]):
            waiting.add(job_id)
    return waiting


def resend_lost(client: redis.Redis, app: Celery, grace_s: float, now: float | None = None) -> list[str]:
    """Send again the pending jobs whose message is nowhere; returns their ids."""
    now = now or time.time()
    raw_due: Any = client.zrangebyscore(keys.PENDING_JOBS, 0, now - grace_s, start=0, num=SCAN_LIMIT)
    due = [j.decode() for j in raw_due]
    if not due:
        return []
    pipe = client.pipeline(transaction=False)
    for job_id in due:
        pipe.exists(keys.job_message(job_id))
        pipe.exists(keys.job_epoch(job_id))
        pipe.get(keys.job_delivery(job_id))
    replies = pipe.execute()
    records: dict[str, delivery.Delivery] = {}
    unrecorded = []
    for i, job_id in enumerate(due):
        has_copy, started, raw = replies[3 * i : 3 * i + 3]
        if not has_copy or started:
            forget_message(client, job_id)  # started (or expired): nothing to watch
            continue
        record = delivery.parse(raw)
        if record is None:
            unrecorded.append(job_id)  # queued before the records existed: sent once more
        else:
            records[job_id] = record
    waiting = _where(client, records) if records else set()
    if waiting:
        client.zadd(keys.PENDING_JOBS, dict.fromkeys(waiting, now))  # still waiting: look later
    sent = [j for j in [*records, *unrecorded] if j not in waiting and _send_again(client, app, j, now)]
    if sent:
        log.warning("sent again %d job(s) whose message was lost: %s", len(sent), ", ".join(sent))
    return sent


def _send_again(client: redis.Redis, app: Celery, job_id: str, now: float) -> bool:
    """Queue the job's message copy again, with a delivery record of its own, in one transaction."""
    message: Any = client.get(keys.job_message(job_id))
    if message is None:
        return False  # started (or cancelled) meanwhile
    doc = json.loads(message)
    queue = doc["queue"] if not doc["queue"].startswith(keys.worker_queue("")) else keys.SHARED_QUEUE
    band = priority.job_band(doc["job"])
    queued = task_message(app, keys.GENERATE_TASK, job_id, [doc["job"]], queue, band)
    pipe = client.pipeline(transaction=True)
    delivery.record(pipe, job_id, delivery.Delivery(queued.tag, queued.key, now), DEFAULTS.job_ttl_s)
    pipe.zadd(keys.PENDING_JOBS, {job_id: now})
    pipe.lpush(queued.key, queued.payload)
    pipe.execute()
    return True
