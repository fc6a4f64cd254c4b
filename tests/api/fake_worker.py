"""A fake worker: takes kvferry.generate messages off the shared queue and its own (raw kombu JSON, no Celery
consumer), plays the worker's side of the stream protocol and records Celery result states the
way a real worker would. What it does depends on a marker word in the prompt."""

from __future__ import annotations

import base64
import json
import threading
import time
from dataclasses import dataclass

import redis
from celery import Celery

from broker import keys, priority
from broker.codec import decode_job, encode_result
from broker.jobs import events as job_events
from broker.jobs.lease import JobLeases, make_owner
from broker.messages import GenerateJob, GenerateResult, JobDone, JobFailed, TokenDelta, Usage

WORKER = "fake@test"
DEFAULT_PIECES = ("Hello", ",", " world")
TOOL_CALL_PIECES = (
    "Checking.\n<tool",
    '_call>\n{"name": "get_',
    'weather", "arguments": {"ci',
    'ty": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_',
    "call>",
)
TOOL_CUT_PIECES = (  # a second parallel call cut by max_tokens
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n',
    '<tool_call>\n{"name": "get_time", "argu',
)
USAGE = Usage(prompt_tokens=7, completion_tokens=3, cached_tokens=4)


@dataclass
class Seen:
    job_id: str
    job: GenerateJob


def prompt_text(job: GenerateJob) -> str:
    return job.prompt or " ".join(m.content for m in job.messages)


class FakeWorker:
    def __init__(self, redis_url: str, celery: Celery) -> None:
        self.redis = redis.Redis.from_url(redis_url)
        self.celery = celery
        self.leases = JobLeases(self.redis, ttl_s=60)
        self.seen: list[Seen] = []
        self.consuming = threading.Event()
        self.consuming.set()
        self._paused = threading.Event()  # set while the loop is parked, not in a BRPOP
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-worker", daemon=True)
        self._jobs: list[threading.Thread] = []

    def start(self) -> FakeWorker:
        self._thread.start()
        return self

    def pause(self) -> None:
        """Stop taking jobs; returns once no BRPOP is in flight, so later jobs stay queued."""
        self.consuming.clear()
        assert self._paused.wait(5)

    def resume(self) -> None:
        self._paused.clear()
        self.consuming.set()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for t in self._jobs:
            t.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.consuming.is_set():
                self._paused.set()
                time.sleep(0.02)
                continue
            self._paused.clear()
            # every band of the shared queue and its own, the lowest band first (as a worker's BRPOP)
            own = priority.queue_keys(keys.worker_queue(WORKER))
            bands = zip(priority.queue_keys(keys.SHARED_QUEUE), own, strict=True)
            popped = self.redis.brpop([k for pair in bands for k in pair], timeout=0.1)
            if popped is None:
                continue
            message = json.loads(popped[1])
            job_id = message["headers"]["id"]
            args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
            job = decode_job(args[0])
            self.seen.append(Seen(job_id, job))
            t = threading.Thread(target=self._job, args=(job_id, job), daemon=True)
            self._jobs.append(t)
            t.start()

    def _publish(self, job_id: str, event: TokenDelta | JobDone | JobFailed, check: bool = False) -> bool:
        return job_events.publish(self.redis, job_id, event, check_cancel=check)

    def _fail(self, job_id: str, failed: JobFailed) -> None:
        self._publish(job_id, failed)
        self.celery.backend.mark_as_failure(job_id, RuntimeError(failed.message))

    def _done(self, job_id: str, job: GenerateJob, text: str, finish: str, n: int) -> None:
        result = GenerateResult(
            job_id, job.model, text, tuple(range(n)), finish, USAGE, WORKER, 0.01, 0.02, 0.03
        )
        self._publish(job_id, JobDone(result))
        self.celery.backend.store_result(job_id, encode_result(result), "SUCCESS")

    def _job(self, job_id: str, job: GenerateJob) -> None:
        text = prompt_text(job)
        if self.redis.exists(keys.job_cancel(job_id)):  # what Celery does with a revoked message
            self.celery.backend.mark_as_revoked(job_id, "revoked")
            return
        self.leases.start(job_id, make_owner(WORKER, "fake"), keys.worker_jobs(WORKER))  # running, leased
        if "TOO_LONG" in text:
            self._fail(job_id, JobFailed("invalid_request_error", "prompt is too long", 400, "messages"))
        elif "NO_MODEL" in text:
            self._fail(job_id, JobFailed("not_found_error", "model not served", 404, "model"))
        elif "CRASH_LATER" in text:
            self._publish(job_id, TokenDelta("Hello", (1,)))
            self._fail(job_id, JobFailed("server_error", "RuntimeError: boom", 500))
        elif "CRASH" in text:
            self._fail(job_id, JobFailed("server_error", "RuntimeError: boom", 500))
        elif "VANISH" in text:  # killed before it could write anything
            self.celery.backend.mark_as_failure(job_id, RuntimeError("worker lost"))
        elif "SILENT" in text:
            return
        elif "TOOL_CUT" in text:  # a complete call, then one cut by max_tokens
            for i, piece in enumerate(TOOL_CUT_PIECES):
                self._publish(job_id, TokenDelta(piece, (i,)))
            self._done(job_id, job, "".join(TOOL_CUT_PIECES), "length", len(TOOL_CUT_PIECES))
        elif "TOOL_CALL" in text:  # Hermes-format calls, cut mid-markup (tests/api/test_tools.py)
            for i, piece in enumerate(TOOL_CALL_PIECES):
                self._publish(job_id, TokenDelta(piece, (i,)))
            self._done(job_id, job, "".join(TOOL_CALL_PIECES), "stop", len(TOOL_CALL_PIECES))
        elif "LAG" in text:  # the last character only shows up in the final result
            self._publish(job_id, TokenDelta("caf", (1,)))
            self._done(job_id, job, "café", "length", 2)
        elif "SLOW" in text:
            sent = ""
            for i in range(400):
                time.sleep(0.02)
                sent += "x"
                if self._publish(job_id, TokenDelta("x", (i,)), check=True):
                    self._done(job_id, job, sent, "abort", i + 1)
                    return
            self._done(job_id, job, sent, "length", 400)
        else:
            for i, piece in enumerate(DEFAULT_PIECES):
                self._publish(job_id, TokenDelta(piece, (i,)))
            self._done(job_id, job, "".join(DEFAULT_PIECES), "stop", len(DEFAULT_PIECES))
