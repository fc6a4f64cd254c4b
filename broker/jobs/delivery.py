"""The sweeps' own small records of a job's Celery message, so that no sweep parses a payload.

Two strings with a TTL, written with the message itself (the api's submit transaction, a resend):
- keys.job_delivery(job_id): the message's delivery tag, its list (the queue's list for the
  message's priority band, broker/priority.py: each band list is first in, first out, the queue
  as a whole is not) and the job's submit time; the lost-message check
  (workers/jobs/lost_messages.py) finds the job in O(1) from it: among the unacked messages by
  its tag (HEXISTS), or still queued by its list's depth and how far the list's workers got
  (QUEUES_STARTED, per band list).
- keys.message_job(tag): the job id behind a delivery tag, for the orphan sweep
  (workers/jobs/reaper.py), which finds old unacked messages by tag. A message some other
  producer queued (a plain send_task) has none: the sweep reads its payload once and writes it
  ("" for a message that is no job of ours), so later passes read only this.

kombu keeps a message's delivery tag through every redelivery (its properties carry it), so the
records stay true until the job's TTL, whoever holds the message. Only the helpers here write or
read them; on a pipeline (sync or asyncio) or a client.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aioredis

from broker import keys

Pipe = redis.client.Pipeline | aioredis.client.Pipeline
NOT_A_JOB = ""  # message_job's value for a message that is no kvferry.generate job
# A job submitted this much later than another is taken to have been queued after it, whatever
# the submitting processes' clocks and event loops did in between.
SUBMIT_SLACK_S = 1.0


@dataclass(frozen=True, slots=True)
class Delivery:
    tag: str
    queue: str  # the Redis list the message was pushed to: its queue's list for its band
    submitted_at: float


def encode(delivery: Delivery) -> str:
    """A job_delivery value (parse() reads it)."""
    return json.dumps({"tag": delivery.tag, "queue": delivery.queue, "at": delivery.submitted_at})


def record(pipe: Pipe, job_id: str, delivery: Delivery, ttl_s: int) -> None:
    """Queue both records' writes on `pipe` (with the message's own push, in one transaction)."""
    pipe.set(keys.job_delivery(job_id), encode(delivery), ex=ttl_s)
    pipe.set(keys.message_job(delivery.tag), job_id, ex=ttl_s)


def parse(raw: bytes | str | None) -> Delivery | None:
    """A job_delivery value (None: no record, or one this version cannot read)."""
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
        return Delivery(str(doc["tag"]), str(doc["queue"]), float(doc["at"]))
    except (ValueError, KeyError, TypeError):
        return None


def note_started(client: redis.Redis, queue_key: str, submitted_at: float) -> None:
    """A worker starts a job it took from the list `queue_key` (a queue's list for one band,
    broker/priority.queue_key): that list's workers got at least this far."""
    client.zadd(keys.QUEUES_STARTED, {queue_key: submitted_at}, gt=True)


def popped(delivery: Delivery, queue_depth: int, started_up_to: float | None) -> bool:
    """Whether the job's message must have left its list: the list is empty, or a worker started
    a job from it that was submitted after this one (first in, first out)."""
    if queue_depth == 0:
        return True
    return started_up_to is not None and started_up_to > delivery.submitted_at + SUBMIT_SLACK_S


def tag_of(payload: Any) -> str | None:
    """The delivery tag in a kombu message (its properties), if it has one."""
    props = payload.get("properties") if isinstance(payload, dict) else None
    tag = props.get("delivery_tag") if isinstance(props, dict) else None
    return tag if isinstance(tag, str) else None
