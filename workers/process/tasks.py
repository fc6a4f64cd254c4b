"""Celery task adapters: decode, hand to the job runner, encode, and tell Celery what to do with
the message when the job did not end (see workers/jobs/runner.py for each outcome)."""

from __future__ import annotations

import logging
import time
from typing import Any

import redis
from celery import Celery, Task
from celery.exceptions import Ignore, Reject

from broker import keys, priority
from broker.codec import CodecError, decode_job, encode_result
from broker.errors import InvalidRequestError
from broker.jobs import delivery
from broker.jobs.lease import StaleLeaseError
from workers.engine.errors import EngineFailedError
from workers.jobs.runner import JobRunner, LeaseBusyError

log = logging.getLogger(__name__)


def register_tasks(app: Celery, runner: JobRunner) -> None:
    @app.task(name=keys.GENERATE_TASK, bind=True, acks_late=True, reject_on_worker_lost=True)
    def generate(self: Task, job: dict[str, Any]) -> dict[str, Any]:
        """kvferry.generate(job) -> result: the public task (see broker/messages.py for both)."""
        picked_at = time.time()  # the worker's first stage time (see ops/bench/queue/run.py)
        job_id = self.request.id
        try:
            decoded = decode_job(job)
        except (InvalidRequestError, CodecError) as exc:
            # A producer that bypassed the api sent a bad job (say, seed 2**64): it fails alone,
            # before any engine sees it, with a 400 in its stream like any bad request.
            runner.refuse(job_id, job, exc)
            raise
        info = self.request.delivery_info or {}
        queue = info.get("routing_key")
        if queue and decoded.submitted_at:  # how far this band list's workers got (lost_messages.py)
            try:
                key = priority.queue_key(queue, priority.message_band({"properties": info}))
                delivery.note_started(runner.redis, key, decoded.submitted_at)
            except redis.RedisError as exc:  # a lost message of this queue is then found later
                log.warning("job %s: cannot note its queue's progress: %s", job_id, exc)
        try:
            return encode_result(runner.run(job_id, decoded, picked_at))
        except EngineFailedError as exc:
            # The engine failed, not the job: back on its queue (kombu requeues at the far end,
            # behind what waits), to resume on a new lease after the tokens its stream holds.
            log.warning("job %s: %s; handing it back for redelivery", job_id, exc)
            raise Reject(str(exc), requeue=True) from exc
        except (StaleLeaseError, LeaseBusyError) as exc:
            # Another worker runs (or ran) this job: this copy records nothing, the other answers.
            log.warning("job %s: %s; dropping this copy", job_id, exc)
            raise Ignore() from exc
