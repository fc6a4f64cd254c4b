"""JobRunner: runs one delivered copy of a job. It takes the job's lease (or waits while another
worker, or another copy in this process, holds it), replays a job that already ended, runs one
JobAttempt, and maps errors to what Celery should do with the message.

What the task does with each outcome (workers/process/tasks.py):
- a result: success (a copy of a job that ended elsewhere returns that same result);
- InvalidRequestError, JobTimeLimitError, other errors: a final JobFailed in the stream, the
  message is acked as failed;
- EngineFailedError (the engine failed, not the job): no event, the lease released, the message
  requeued for redelivery (it resumes after the tokens the stream holds); counted per job, and
  the MAX_ATTEMPTS-th ends it failed (JobAttemptsError);
- StaleLeaseError (another epoch runs the job) and LeaseBusyError: nothing written, no state.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from typing import Any

import redis

from broker import keys
from broker.errors import InvalidRequestError, KvferryError, UnknownModelError
from broker.jobs import events as job_events
from broker.jobs.events import STREAM_TTL_S, FencedStream, StreamProgress
from broker.jobs.lease import EPOCH_TTL_S, StaleLeaseError
from broker.messages import GenerateJob, GenerateResult, JobFailed
from workers.engine.errors import EngineFailedError
from workers.jobs.attempt import JobAttempt, JobTimeLimitError
from workers.jobs.engine_service import EngineService
from workers.jobs.lease_keeper import LeaseKeeper, OwnedLease
from workers.jobs.lost_messages import forget_message

log = logging.getLogger(__name__)
LEASE_POLL_S = 0.25
UNHEALTHY_BACKOFF_S = 1.0
# Attempts whose engine failed (keys.job_engine_failures): a job that fails this many ends failed.
# Lease takes are not counted: redeliveries after worker deaths or lease takeovers are harmless.
MAX_ATTEMPTS = 8


class LeaseBusyError(KvferryError):
    """Another worker kept the job's lease for longer than a job may run; this copy gives up."""


class JobAttemptsError(KvferryError):
    """The job's engine failed on every attempt (MAX_ATTEMPTS): it ends failed, not redelivered."""


class JobEndedError(KvferryError):
    """A copy of a job that already failed: the same failure again, without running it."""


class JobRunner:
    def __init__(
        self, service: EngineService, leases: LeaseKeeper, time_limit_s: float, ttl_s: int = STREAM_TTL_S
    ) -> None:
        self.service = service
        self.redis = service.redis
        self.leases = leases
        self.stream = FencedStream(service.redis, ttl_s)
        self.time_limit_s = time_limit_s
        self._copies: collections.Counter[str] = collections.Counter()  # copies here, per job id
        self._copies_lock = threading.Lock()

    def run(self, job_id: str, job: GenerateJob, picked_at: float | None = None) -> GenerateResult:
        """`picked_at`: when the task began (unix time), the first of the attempt's stage times."""
        stages = {"picked": picked_at or time.time()}
        self._enter(job_id)
        try:
            got = self._take(job_id)
            if isinstance(got, StreamProgress):
                return self._replay(job_id, got)
            owned, before, cancelled = got
            stages["leased"] = time.time()
            try:
                return self._run_leased(job_id, job, owned, before, cancelled, stages)
            finally:
                self.leases.release(owned)  # a requeued copy must not wait for it
        finally:
            self._leave(job_id)

    def refuse(self, job_id: str, raw: Any, exc: Exception) -> None:
        """The final 400 of a job whose message does not decode (nothing ran; no lease taken)."""
        tenant = raw.get("tenant") if isinstance(raw, dict) else None
        param = exc.param if isinstance(exc, InvalidRequestError) else None
        event = JobFailed("invalid_request_error", f"the job does not decode: {exc}", 400, param)
        forget_message(self.redis, job_id)
        with contextlib.suppress(StaleLeaseError):  # a copy under a lease answers it instead
            self.stream.publish(job_id, tenant if isinstance(tenant, str) else "", event)
        self.service.count(failed=1)

    def _enter(self, job_id: str) -> None:
        """Counted here; listed in Redis as this worker's by the lease take (JobLeases.start)."""
        with self._copies_lock:
            self._copies[job_id] += 1

    def _leave(self, job_id: str) -> None:
        with self._copies_lock:
            self._copies[job_id] -= 1
            last = self._copies[job_id] <= 0
            if last:
                del self._copies[job_id]
        if last:
            self.redis.srem(keys.worker_jobs(self.service.identity.name), job_id)

    def _take(self, job_id: str) -> tuple[OwnedLease, StreamProgress, bool] | StreamProgress:
        """The job's lease, what its stream held and whether it is cancelled, or (when it ended
        meanwhile) what its stream says. While another holds the lease this copy waits: its holder
        renews it while alive, and it lapses soon after a death, so a wait ends in the job's final
        event or in a lease of our own. A job that ended before the first try is found by the
        read under the lease (an epoch more fences nobody: nothing of it runs any more)."""
        deadline = time.monotonic() + self.time_limit_s + 60
        waited = False
        while True:
            if waited and job_events.ended(self.redis, job_id):
                return job_events.progress(self.redis, job_id)
            got = self.leases.try_take(job_id)
            if isinstance(got, tuple):
                owned, started = got
                try:
                    before = job_events.progress_of(started.entries)
                except BaseException:
                    self.leases.release(owned)
                    raise
                if before.final:
                    self.leases.release(owned)
                    return before
                if waited:
                    log.info("job %s: lease taken (epoch %d) after waiting", job_id, owned.epoch)
                return owned, before, started.cancelled
            if not waited:
                log.info("job %s is leased by %s (epoch %d); waiting", job_id, got.owner, got.epoch)
                waited = True
            if time.monotonic() > deadline:
                raise LeaseBusyError(f"job {job_id} is still leased by {got.owner}")
            time.sleep(LEASE_POLL_S)

    def _engine_failed(self, job_id: str, exc: EngineFailedError) -> int:
        """Count an attempt whose engine failed; returns the job's count so far. A Redis that failed
        under the job is not the job's engine failing (and cannot be counted in): 0."""
        if isinstance(exc.__cause__, redis.RedisError):
            return 0
        key = keys.job_engine_failures(job_id)
        try:
            pipe = self.redis.pipeline(transaction=True)
            pipe.incr(key)
            pipe.expire(key, EPOCH_TTL_S)
            return int(pipe.execute()[0])
        except redis.RedisError as err:
            log.warning("job %s: cannot count its engine failure: %s", job_id, err)
            return 0

    def _replay(self, job_id: str, ended: StreamProgress) -> GenerateResult:
        if ended.done is not None:  # finished before this copy: the same answer again
            return ended.done.result
        assert ended.failed is not None
        raise JobEndedError(f"job {job_id} already failed: {ended.failed.message}")

    def _run_leased(
        self,
        job_id: str,
        job: GenerateJob,
        owned: OwnedLease,
        before: StreamProgress,
        cancelled: bool,
        stages: dict[str, float],
    ) -> GenerateResult:
        service = self.service
        attempt = JobAttempt(service, self.stream, job_id, job, owned, self.time_limit_s, stages)
        service.count(running=1)
        try:
            try:
                result = attempt.run(before, cancelled)
            except redis.RedisError as exc:  # Redis gone past the client's retries: not the job's fault
                raise EngineFailedError(f"Redis failed under the job: {exc}") from exc
            service.count(done=1)
            return result
        except StaleLeaseError:
            raise  # another epoch runs the job: nothing to publish
        except EngineFailedError as exc:
            failures = self._engine_failed(job_id, exc)
            if failures >= MAX_ATTEMPTS:  # it fails every engine it meets: a poison, not bad luck
                service.count(failed=1)
                message = f"the job failed {failures} attempts, each in its engine: {exc}"
                attempt.publish_failed("server_error", message, 500)
                raise JobAttemptsError(message) from exc
            loop = service.current_loop
            if loop is not None and not loop.healthy:
                time.sleep(UNHEALTHY_BACKOFF_S)  # the copy requeued now must not spin on this worker
            raise  # not the job's failure: it is redelivered and resumes
        except JobTimeLimitError:
            service.count(failed=1)
            raise
        except InvalidRequestError as exc:
            service.count(failed=1)
            kind, status = (
                ("not_found_error", 404)
                if isinstance(exc, UnknownModelError)
                else ("invalid_request_error", 400)
            )
            attempt.publish_failed(kind, exc.message, status, exc.param)
            raise
        except Exception as exc:
            service.count(failed=1)
            attempt.publish_failed("server_error", f"{type(exc).__name__}: {exc}", 500)
            raise
        finally:
            service.count(running=-1)
