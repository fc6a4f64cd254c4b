"""EngineLoop: the one thread that owns an engine; any thread may submit to it."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from kvstore.tiers.stored_block import StoredBlock
from kvstore.tiers.tail import Tail
from workers.engine.errors import EngineFailedError
from workers.engine.llm_engine import LLMEngine
from workers.engine.requests.request import GenerationRequest
from workers.engine.stats.snapshot import EngineStats
from workers.engine.tiers.resident import ResidentBlocks
from workers.loop.driver import Driver
from workers.loop.handle import RequestHandle
from workers.loop.idle_event import IdleEvent
from workers.loop.messages import Abort, Call, LoopMessage, Submit, WarmBlocks

log = logging.getLogger(__name__)
T = TypeVar("T")
STATS_IDLE_S = 0.5  # while idle, latest_stats is refreshed at least this often


class EngineLoop:
    """Concurrent submitters are batched together: every step takes whatever has arrived.

    Supervision: a step that raises fails every request in flight with EngineFailedError
    (retryable), releases their blocks, checks the pool and goes on serving (`restarts` counts
    these). If the loop thread itself dies, `healthy` turns False and every submit fails at once.
    `latest_stats` is a snapshot the loop thread stores after steps and at least every
    STATS_IDLE_S while idle: other threads read it without waiting on the loop.
    """

    def __init__(self, engine: LLMEngine, name: str = "kvferry-engine") -> None:
        self.engine = engine  # the loop thread's alone: other threads use the facts below
        # Fixed once the engine is built, so any thread may read them: what a task thread needs to
        # tokenise a prompt and hash its blocks, and the view of what blocks this worker holds.
        self.tokenizer = engine.served.tokenizer
        self.block_size = engine.pool.block_size
        self.fingerprint = engine.served.fingerprint
        self.resident: ResidentBlocks | None = engine.tiers.resident if engine.tiers is not None else None
        self.grammars = engine.served.grammars  # thread-safe: task threads compile before they submit
        self._inbox: queue.Queue[LoopMessage | None] = queue.Queue()
        self._work = Driver(engine)  # the loop thread's: messages, steps, recovery
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._stopped = threading.Event()
        # Held only around "is it stopped? then queue" and the final "stop, then drain", so that
        # no message is queued after the last drain. Never held during a step.
        self._gate = threading.Lock()
        self.failure: BaseException | None = None  # what killed the loop thread, if anything did
        # Set while the loop waits with nothing to run, cleared by a submit and while stepping: the
        # KV writer writes through once it has been set a while (it yields the cores otherwise).
        self.idle = IdleEvent()
        # No step before this (time.monotonic()): the gap after a batch-only step while interactive
        # traffic flows (BatchSizer.pause), ended early by an interactive submit.
        self._pause_until = 0.0

    @property
    def healthy(self) -> bool:
        """True while the loop thread runs and is not recovering from a failed step."""
        return self._thread.is_alive() and not self._stopped.is_set() and not self._work.recovering

    @property
    def restarts(self) -> int:
        """Steps that failed and were recovered from."""
        return self._work.restarts

    @property
    def latest_stats(self) -> EngineStats | None:
        return self._work.latest_stats

    def start(self) -> EngineLoop:
        self._thread.start()
        return self

    @classmethod
    def build(cls, factory: Callable[[], LLMEngine], name: str = "kvferry-engine") -> EngineLoop:
        """Build the engine on the loop's own thread, then run the loop there; returns once built
        (the factory's exception, if it raises). The thread that builds the engine is then the one
        thread of the process that runs torch's parallel regions (workers/engine/kernels/omp_team.py)."""
        built: Future[EngineLoop] = Future()

        def run() -> None:
            try:
                loop = cls(factory(), name)
            except BaseException as exc:
                built.set_exception(exc)
                return
            loop._thread = threading.current_thread()
            built.set_result(loop)
            loop._run()

        threading.Thread(target=run, name=name, daemon=True).start()
        return built.result()

    def stop(self, timeout: float = 10.0) -> None:
        self._inbox.put(None)
        self._thread.join(timeout)

    def __enter__(self) -> EngineLoop:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def submit(self, request: GenerationRequest) -> RequestHandle:
        """Queue a request (see LLMEngine.add_request); errors arrive through the handle."""
        handle = RequestHandle(request.request_id, self.abort, request.reports_first_out)
        msg = Submit(handle, request)
        self.idle.clear()
        if not self._put(msg):
            self.idle.set_long_ago()  # a stopped loop never holds the KV writer back
            handle._fail(self._stopped_error())
        return handle

    def abort(self, request_id: str) -> None:
        self._put(Abort(request_id))

    def interactive_flows_until(self, deadline: float) -> None:
        """Interactive requests flow elsewhere in the fleet until `deadline` (time.monotonic()):
        batch steps stay sized meanwhile. One float stored, read by the loop thread at its next
        step: no message, so it never waits behind a step."""
        self.engine.scheduler.sizer.elsewhere_until = deadline

    def warm(self, blocks: list[StoredBlock], at_request: bool = True, tails: tuple[Tail, ...] = ()) -> None:
        """Hand blocks fetched from Redis to the engine's warm tier, and session turns' partial last
        blocks to its kept tails (a request submitted after this finds them there). at_request
        False: a warm start's (they count as warm tokens)."""
        if blocks or tails:
            if self.resident is not None:  # resident once they land: no second fetch of them meanwhile
                self.resident.expect([b.block_hash for b in blocks])
                for tail in tails:
                    self.resident.expect_tail(tail.parent)
            self._put(WarmBlocks(blocks, at_request, tails))

    def check_integrity(self, timeout: float | None = 30.0) -> None:
        """The engine's invariants, checked on the loop thread between steps (AssertionError)."""
        self.call(lambda engine: engine.check_integrity(), timeout=timeout)

    def call(self, fn: Callable[[LLMEngine], T], timeout: float | None = 30.0) -> T:
        """Run fn(engine) on the loop thread, between steps (figures, integrity checks)."""
        future: Future[T] = Future()
        if not self._put(Call(fn, future)):
            raise self._stopped_error()
        return future.result(timeout)

    def _put(self, msg: LoopMessage) -> bool:
        with self._gate:
            if self._stopped.is_set():
                return False
            self._inbox.put(msg)
            return True

    def _stopped_error(self) -> EngineFailedError:
        if self.failure is not None:
            why = f"{type(self.failure).__name__}: {self.failure}"
            err = EngineFailedError(f"the engine loop has died: {why}")
            err.__cause__ = self.failure
            return err
        return EngineFailedError("the engine loop has stopped")

    # -- the loop thread ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._work.refresh_stats(force=True)
            while self._drain(block=not self.engine.has_unfinished(), pause=self._pause_left()):
                if self.engine.has_unfinished() and self._pause_left() <= 0:
                    self.idle.clear()
                    self._work.step(self._inbox.empty)
                    self._pause_until = time.monotonic() + self.engine.batch_pause_s
        except BaseException as exc:
            self.failure = exc
            log.exception("the engine loop thread died; failing every request")
        finally:
            self.idle.set_long_ago()  # nothing runs here any more: the KV writer must not wait for it
            with self._gate:
                self._stopped.set()
            err = self._stopped_error()
            self._work.fail_all(err)
            self._fail_queued(err)

    def _pause_left(self) -> float:
        return max(0.0, self._pause_until - time.monotonic())

    def _fail_queued(self, err: EngineFailedError) -> None:
        while True:
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(msg, Submit):
                msg.handle._fail(err)
            elif isinstance(msg, Call):
                msg.future.set_exception(err)

    def _drain(self, block: bool, pause: float = 0.0) -> bool:
        """Handle every waiting message (waiting up to STATS_IDLE_S for one when idle, or `pause`
        seconds: the gap after a batch-only step, BatchSizer.pause); False once asked to stop."""
        if block and self._inbox.empty():
            self.idle.set()
        try:
            if block or pause > 0:
                msg = self._inbox.get(timeout=STATS_IDLE_S if block else pause)
            else:
                msg = self._inbox.get_nowait()
        except queue.Empty:
            if block:
                self._work.refresh_stats(force=True)
            return True
        while msg is not None:
            if isinstance(msg, Submit) and not msg.request.is_batch:
                self._pause_until = 0.0  # an interactive arrival ends the gap: it starts now
            self._work.handle(msg)
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                return True
        return False
