"""JobAttempt: one leased run of a job on this worker's engine. Resumes after the tokens the
stream holds, streams new ones (each with its index and the lease epoch, through the fenced
script), enforces the job time limit, and publishes the result.

The turn's bookkeeping (workers/sessions/keeper.py) never holds up nor fails the answer: what
the next turn needs (its exact tokens) is saved before JobDone, what waits for the KV writer
after it; any failure of it is logged and counted, and the job still ends done."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import redis

from broker.errors import KvferryError, UnknownModelError
from broker.jobs.events import FencedStream, StreamProgress
from broker.jobs.lease import StaleLeaseError
from broker.messages import (
    GenerateJob,
    GenerateResult,
    JobDone,
    JobFailed,
    StreamEvent,
    TokenDelta,
    TokenLogprob,
    Usage,
)
from workers.engine.errors import EngineFailedError
from workers.engine.requests.output import RequestOutput
from workers.engine.requests.request import GenerationRequest
from workers.jobs.engine_service import EngineService
from workers.jobs.lease_keeper import OwnedLease
from workers.jobs.logprob_text import LogprobText
from workers.jobs.prompt import prompt_token_ids
from workers.loop.handle import RequestHandle
from workers.sessions.keeper import AfterWrite

if TYPE_CHECKING:
    from workers.loop.protocol import Loop

log = logging.getLogger(__name__)
STREAM_FLUSH_S = 0.03
# A batch line's tokens have no reader before its final (the runner reads end streams only): they
# are written this seldom, enough for a redelivery to resume and a cancel to be seen, and the
# worker's thread, Redis and the api skip a write per step per job.
BATCH_FLUSH_S = 1.0
T = TypeVar("T")
HEALTHY_WAIT_S = 5.0  # a job that finds its engine loop restarting waits this long for it


class JobTimeLimitError(KvferryError, TimeoutError):
    """The job ran past KVFERRY_JOB_TIME_LIMIT_S and was stopped (its blocks freed)."""


def wait_healthy(loop: Loop, timeout_s: float = HEALTHY_WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not loop.healthy:
        if time.monotonic() > deadline:
            raise EngineFailedError("the engine loop is not healthy")
        time.sleep(0.05)


class JobAttempt:
    def __init__(
        self,
        service: EngineService,
        stream: FencedStream,
        job_id: str,
        job: GenerateJob,
        owned: OwnedLease,
        time_limit_s: float,
        stages: dict[str, float] | None = None,
    ) -> None:
        self.service = service
        self.stream = stream
        self.job_id = job_id
        self.job = job
        self.owned = owned
        self.epoch = owned.epoch
        self.time_limit_s = time_limit_s
        self.started = time.time()
        self.timed_out = threading.Event()
        # unix times of this attempt's stages; they ride with the final event (keys.job_stages)
        self.stages: dict[str, float] = dict(stages or {})
        self.logprobs: list[TokenLogprob] = []  # of the output, this attempt's and the stream's before it
        self.prompt_logprobs: tuple[TokenLogprob, ...] = ()
        self.prompt_text = ""

    def publish_failed(self, error_type: str, message: str, status: int, param: str | None = None) -> None:
        event = JobFailed(error_type, message, status, param, epoch=self.epoch)
        self.stream.publish(self.job_id, self.job.tenant, event)

    def run(self, before: StreamProgress, cancelled: bool = False) -> GenerateResult:
        """`cancelled`: the job's cancel flag as read with `before` (later flags come back from
        every publish)."""
        service, job, job_id = self.service, self.job, self.job_id
        if job.model != service.served_model:
            raise UnknownModelError(
                f"model {job.model!r} is not served (this worker serves {service.served_model!r})"
            )
        loop = service.loop()
        wait_healthy(loop)
        stored = service.sessions.stored_tokens(job)
        ids = prompt_token_ids(job, loop.tokenizer, stored)
        grammar = loop.grammars.compile(job.params.structured_outputs)  # a bad spec: 400 here
        if job.params.prompt_logprobs is None:  # else the prompt is computed whole
            service.prefetch(ids, job.kv_salt, tails=bool(job.session_id))
        resumed = len(before.token_ids)
        self.logprobs = list(before.logprobs)
        self.prompt_logprobs = before.prompt_logprobs
        if job.echo:
            self.prompt_text = job.prompt or loop.tokenizer.decode(ids, skip_special_tokens=False)
        texts = LogprobText(loop.tokenizer)
        request = GenerationRequest(
            job_id,
            ids,
            job.params,
            cache_salt=job.kv_salt,
            output_token_ids=before.token_ids,
            streamed_chars=before.text_chars,
            keep_tail=bool(job.session_id),  # its next turn starts with this one's partial last block
            grammar=grammar,
            job_class=job.job_class,
            priority=job.priority,
            # _stream publishes an interactive job's first token before the next step runs
            reports_first_out=job.job_class != "batch",
        )
        handle = loop.submit(request)
        self.stages["submitted"] = time.time()
        presence = service.interactive_started() if job.job_class != "batch" else None

        def time_up() -> None:
            self.timed_out.set()
            handle.cancel()  # the engine aborts it and frees its blocks

        timer = threading.Timer(max(0.0, self.time_limit_s), time_up)
        timer.daemon = True
        timer.start()
        try:
            if cancelled:
                handle.cancel()
            final, first_token_at, last = self._stream(handle, resumed, before.text_chars, ids, texts)
        except BaseException:
            # Whatever stopped this attempt (Redis, a lost lease), the request must not run on in
            # the engine: its blocks would stay taken, and a copy delivered here later would find
            # its request id still running.
            handle.cancel()
            raise
        finally:
            handle.first_out()  # never left waiting for (it is a no-op once the token is out)
            timer.cancel()
            if presence is not None:
                presence.end()
        now = time.time()
        self.stages["finished"] = now
        if first_token_at is not None:
            self.stages["first_token"] = first_token_at
        if self.timed_out.is_set():
            message = f"the job ran past its time limit of {self.time_limit_s:g}s"
            failed = JobFailed("timeout", message, 504, epoch=self.epoch)
            self.stream.publish_many(self.job_id, job.tenant, [*last, failed], self.stages)
            raise JobTimeLimitError(message)
        submitted = job.submitted_at or self.started
        # A redelivery: what the blocks that survived (pool, warm tier, Redis) did not cover; none
        # when the stream already held the whole answer (it finished without a step). Not
        # cached_tokens: that counts prompt tokens only, and the hits may reach into the output.
        reused = final.pool_tokens + final.warm_tokens + final.redis_tokens
        recomputed = (
            max(0, len(ids) + resumed - reused) if self.epoch > 1 and final.completion_tokens > resumed else 0
        )
        result = GenerateResult(
            job_id=job_id,
            model=service.served_model,
            text=final.text,
            token_ids=final.token_ids,
            finish_reason=final.finish_reason or "stop",
            usage=Usage(
                final.prompt_tokens,
                final.completion_tokens,
                final.cached_tokens,
                pool_tokens=final.pool_tokens,
                warm_tokens=final.warm_tokens,
                redis_tokens=final.redis_tokens,
                recomputed_tokens=recomputed,
            ),
            worker=service.identity.name,
            queue_wait_s=max(0.0, self.started - submitted),
            ttft_s=(first_token_at or now) - submitted,
            latency_s=now - submitted,
            logprobs=tuple(self.logprobs) if job.params.logprobs is not None else (),
            prompt_logprobs=self.prompt_logprobs,
            prompt_text=self.prompt_text,
        )
        after: AfterWrite | None = None
        if final.finish_reason in ("stop", "length"):
            after = self._bookkeeping(lambda: service.sessions.remember(job, loop, ids, final, stored))
        # The last delta and the result in one round trip: a 1-token job writes its stream once.
        self.stream.publish_many(job_id, job.tenant, [*last, JobDone(result, epoch=self.epoch)], self.stages)
        if after is not None:
            self._bookkeeping(lambda: service.sessions.after_write(after))
        return result

    def _bookkeeping(self, work: Callable[[], T]) -> T | None:
        """The turn's session/tier bookkeeping: whatever it raises costs the next turn cache hits,
        never this job its answer (logged and counted)."""
        try:
            return work()
        except redis.RedisError as exc:  # a full or absent Redis: expected now and then
            self.service.sessions.after_writes.count_failure()
            log.warning("job %s: the session/tier update failed: %s", self.job_id, exc)
        except Exception:
            self.service.sessions.after_writes.count_failure()
            log.exception("job %s: the session/tier update failed", self.job_id)
        return None

    def _stream(
        self, handle: RequestHandle, start: int, text_start: int, prompt_ids: list[int], names: LogprobText
    ) -> tuple[RequestOutput, float | None, list[StreamEvent]]:
        """Publish the handle's deltas; returns its final output, when the first token came, and
        the last delta, unpublished: it goes out with the final event. The prompt's echo (text and
        logprobs) rides on the delta that starts the output."""
        first_token_at = None
        final = None
        texts: list[str] = []
        token_ids: list[int] = []
        lps: list[TokenLogprob] = []
        batch = self.job.job_class == "batch"
        flush_s = BATCH_FLUSH_S if batch else STREAM_FLUSH_S
        last_publish = time.monotonic() if batch else 0.0  # an interactive first token goes at once
        last: list[StreamEvent] = []
        for out in handle:
            if self.owned.lost.is_set():
                handle.cancel()
                raise StaleLeaseError(f"job {self.job_id}: lease epoch {self.epoch} lost")
            if out.delta_token_ids and first_token_at is None:
                first_token_at = time.time()
            if not token_ids and not any(texts):  # a delta begins here: at the engine's offsets
                start = out.token_start
                text_start = out.text_start if out.text_start >= 0 else text_start
            texts.append(out.delta_text)
            token_ids.extend(out.delta_token_ids)
            lps.extend(names.entries(out.delta_logprobs))
            if out.prompt_logprobs:
                self.prompt_logprobs = names.prompt(prompt_ids, out.prompt_logprobs)
            now = time.monotonic()
            # The first token goes out at once; later ones ride together within STREAM_FLUSH_S
            # (one XADD per step per job costs the worker, Redis, the api and the client alike).
            if (token_ids or any(texts)) and (out.finished or now - last_publish >= flush_s):
                text = "".join(texts)
                echo = start == 0
                event = TokenDelta(
                    text,
                    tuple(token_ids),
                    start,
                    text_start,
                    self.epoch,
                    tuple(lps),
                    self.prompt_logprobs if echo else (),
                    self.prompt_text if echo else "",
                )
                self.logprobs.extend(lps)
                start, text_start = start + len(token_ids), text_start + len(text)
                texts, token_ids, lps, last_publish = [], [], [], now
                if out.finished:  # the final event takes it along (the handle ends here)
                    last = [event]
                    final = out
                    continue
                try:
                    cancelled = self.stream.publish(self.job_id, self.job.tenant, event)
                except StaleLeaseError:
                    handle.cancel()  # a zombie: stop the request, write nothing more
                    raise
                handle.first_out()  # the engine may step on (it waits for the first one only)
                if cancelled and not out.finished:
                    handle.cancel()
            final = out
        assert final is not None and final.finish_reason is not None
        return final, first_token_at, last
