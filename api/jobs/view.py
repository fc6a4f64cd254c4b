"""A job as GET /v1/jobs/{id} shows it: status from its stream's last event, its lease (who runs
it now) and Celery's state (how a job that wrote no final event ended)."""

from __future__ import annotations

from typing import Any, Literal

from celery import states

from api.jobs.client import JobClient
from api.jobs.meta import JobMeta
from api.jobs.outcome import is_final, outcome_of
from api.schema.answer.bodies import Choice, error_body, response_body, usage_body
from broker.messages import JobDone, JobFailed, StreamEvent

JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled", "cancelling"]
FINAL_STATUSES: frozenset[JobStatus] = frozenset({"succeeded", "failed", "cancelled"})


def error_code(failed: JobFailed) -> str | None:
    return "model_not_found" if failed.status_code == 404 else None


def failed_body(failed: JobFailed) -> dict[str, Any]:
    return error_body(failed.message, failed.error_type, failed.param, error_code(failed))


async def job_view(jobs: JobClient, meta: JobMeta) -> dict[str, Any]:
    job_id = meta.job_id
    count, last = await jobs.last_event(job_id)
    cancelled = await jobs.is_cancelled(job_id)
    outcome: StreamEvent | None = last if is_final(last) else None
    state = None
    running_on: str | None = None
    if outcome is None:
        running_on = await jobs.lease_worker(job_id)
        state = await jobs.celery_state(job_id)
        if state.state in states.READY_STATES:
            count, last = await jobs.last_event(job_id)  # its final event may have landed since
            outcome = last if is_final(last) else outcome_of(job_id, state)

    status: JobStatus
    if isinstance(outcome, JobDone):
        aborted = outcome.result.finish_reason == "abort"
        revoked = state is not None and state.state == states.REVOKED
        status = "cancelled" if revoked or (aborted and cancelled) else "succeeded"
    elif isinstance(outcome, JobFailed):
        status = "failed"
    elif cancelled:
        status = "cancelling"
    elif count or running_on is not None:
        status = "running"
    else:
        status = "queued"

    view: dict[str, Any] = {
        "id": job_id,
        "object": "job",
        "status": status,
        "endpoint": meta.endpoint,
        "model": meta.model,
        "queue": meta.queue,
        "route": {"queue": meta.queue, "reason": meta.reason},
        "created": int(meta.created),
        "session_id": meta.session_id,
        "result": None,
        "error": None,
        "worker": running_on,
        "usage": None,
        # lease epochs the job has run under (1: never redelivered); its result and stream show
        # each token once whatever this is
        "attempts": last.epoch if last is not None else 0,
    }
    if isinstance(outcome, JobDone):
        r = outcome.result
        body = response_body(meta.request(), [Choice.of(r)], r.usage, meta.response_id)
        body["created"] = int(meta.created)
        view.update(result=body, usage=usage_body(r.usage), worker=r.worker or None)
    elif isinstance(outcome, JobFailed):
        view["error"] = failed_body(outcome)["error"]
    return view
