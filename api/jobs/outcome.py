"""A job's outcome as Celery reports it: CeleryState, and the final event a job that ended without
writing one stands for."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from celery import states

from broker.codec import CodecError, decode_result
from broker.messages import GenerateResult, JobDone, JobFailed, StreamEvent, Usage

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CeleryState:
    state: str  # celery.states: PENDING, SUCCESS, FAILURE, REVOKED, RETRY (no STARTED: see celery_app)
    result: Any  # SUCCESS: the encoded GenerateResult; FAILURE: the exception


def is_final(event: StreamEvent | None) -> bool:
    return isinstance(event, (JobDone, JobFailed))


def outcome_of(job_id: str, state: CeleryState) -> StreamEvent | None:
    """The final event a job that ended without writing one (revoked before it ran, killed, its
    stream expired) stands for; None while the job is not over."""
    if state.state == states.SUCCESS:
        try:
            return JobDone(decode_result(state.result))
        except CodecError as exc:  # a bug or a version mismatch, not the client's: log its cause
            log.error("job %s: its result does not decode", job_id, exc_info=exc)
            return JobFailed("server_error", f"unreadable job result: {exc}", 500)
    if state.state == states.FAILURE:
        return JobFailed("server_error", f"the job failed on its worker: {state.result!s}", 500)
    if state.state == states.REVOKED:
        nothing = Usage(0, 0, 0)
        return JobDone(GenerateResult(job_id, "", "", (), "abort", nothing, "", 0.0, 0.0, 0.0))
    return None
