"""Driver: what the engine loop's thread does with each message it takes and each step it
runs, and how it recovers from a step that fails. It runs on that thread alone
(workers/loop/engine_loop.py); other threads read only its snapshots (`latest_stats`, `restarts`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from workers.engine.errors import EngineFailedError, RequestFailedError
from workers.engine.llm_engine import LLMEngine
from workers.engine.stats.snapshot import EngineStats
from workers.loop.handle import RequestHandle, wait_for_first_out
from workers.loop.messages import Abort, Call, LoopMessage, Submit, WarmBlocks

log = logging.getLogger(__name__)
STATS_MIN_GAP_S = 0.05  # while busy, stats are refreshed at most this often (pool.stats() walks every block)
# Failed steps in a row, with no good step between, after which the loop gives up and dies (a
# broken device fails every step): the worker then reports unhealthy instead of churning jobs.
MAX_FAILED_STEPS_IN_ROW = 3


class Driver:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.handles: dict[str, RequestHandle] = {}  # by request id, while the engine runs them
        self.recovering = False
        self.restarts = 0  # steps that failed and were recovered from
        self._failed_in_row = 0
        self._stats_at = 0.0
        self.latest_stats: EngineStats | None = None

    def fail_all(self, err: BaseException) -> None:
        """The loop is gone: every request in flight fails with `err`."""
        handles, self.handles = list(self.handles.values()), {}
        for handle in handles:
            handle._fail(err)

    def handle(self, msg: LoopMessage) -> None:
        if isinstance(msg, Submit):
            try:
                self.engine.add_request(msg.request)
            except Exception as exc:  # typed errors go back to the submitter, nothing queued
                msg.handle._fail(exc)
                return
            self.handles[msg.request.request_id] = msg.handle
        elif isinstance(msg, WarmBlocks):
            try:
                self.engine.admit_prefetched(msg.blocks, msg.at_request)
            except Exception:  # a prefetch lost costs a recompute, never the loop
                log.exception("prefetched blocks could not be admitted; dropped")
        elif isinstance(msg, Abort):
            try:
                out = self.engine.abort_request(msg.request_id)
            except Exception as exc:
                self.restart(exc)
                return
            handle = self.handles.pop(msg.request_id, None)
            if out is not None and handle is not None:
                handle._publish(out)
        elif isinstance(msg, Call):
            try:
                msg.future.set_result(msg.fn(self.engine))
            except Exception as exc:
                msg.future.set_exception(exc)
        else:
            raise TypeError(f"unknown engine message {type(msg).__name__}")

    def step(self, inbox_empty: Callable[[], bool]) -> None:
        """One engine step; its outputs to their handles. `inbox_empty`: whether no message waits
        (then the loop may hold its next step for a first token to go out)."""
        try:
            outputs = self.engine.step()
        except Exception as exc:
            self.restart(exc)
            return
        self._failed_in_row = 0
        first_out: list[RequestHandle] = []
        for out in outputs:
            target = (
                self.handles.pop(out.request_id, None) if out.finished else self.handles.get(out.request_id)
            )
            if target is None:
                continue
            if out.finish_reason == "error":
                target._fail(out.cause or RequestFailedError(out.error or "failed", None))
            elif target._publish(out):
                first_out.append(target)
        if first_out and inbox_empty():  # no message waits for it (a submit, abort, call)
            wait_for_first_out(first_out, self.engine.config.first_token_hold_s)
        self.refresh_stats(force=not self.engine.has_unfinished())

    def restart(self, exc: Exception) -> None:
        """A failure not tied to one request: fail and release everything in flight, check the
        pool, go on. If the check fails, the error escapes and the loop thread dies (unhealthy)."""
        log.error("engine step failed; failing %d requests in flight", len(self.handles), exc_info=exc)
        self.recovering = True  # stays True if recovery raises: the thread is about to die
        self.restarts += 1
        self.engine.abort_all()
        self.engine.check_integrity()
        self.refresh_stats(force=True)
        self.recovering = False  # before the handles fail: their owners may check at once
        err = EngineFailedError(f"the engine step failed: {type(exc).__name__}: {exc}")
        err.__cause__ = exc
        handles, self.handles = list(self.handles.values()), {}
        for handle in handles:
            handle._fail(err)
        self._failed_in_row += 1
        if self._failed_in_row >= MAX_FAILED_STEPS_IN_ROW:
            raise EngineFailedError(f"{self._failed_in_row} engine steps failed in a row") from exc

    def refresh_stats(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._stats_at < STATS_MIN_GAP_S:
            return
        try:
            self.latest_stats = self.engine.stats()  # one attribute store: readers need no lock
        except Exception:
            log.exception("engine stats failed")
        self._stats_at = now
