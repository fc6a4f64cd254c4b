"""AfterWriteQueue: one thread that finishes turns' bookkeeping after their answers are out.

A turn's session record is saved in full, and its pins set, only once the turn's blocks are in
Redis; the KV writer says when (KVWriter.after_written) on its own thread, which must not wait on
Redis for anyone, so it hands the work here. One thread, in the order the turns' writes ended.
A failure is logged and counted, never raised: the answer went out already, and what a lost
update costs is the next turn's cache hits (its exact tokens were saved before the answer)."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from workers.background import BackgroundThread

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AfterWrite:
    """What a turn leaves to do once its blocks are in Redis: ``mark``, the KV writer's last write
    when the turn ended (its own writes are at or before it)."""

    mark: int
    work: Callable[[], None]


class AfterWriteQueue:
    def __init__(self) -> None:
        self.failures = 0  # bookkeeping that raised: logged, counted, never the job's failure
        self._queue: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: BackgroundThread | None = None

    def submit(self, work: Callable[[], None]) -> None:
        with self._lock:
            if self._thread is None:  # dies with the process (a stop flushes it first: flush())
                self._thread = BackgroundThread("kvferry-after-write", self._run)
                self._thread.start()  # assigned first: its body reads it
        self._queue.put(work)

    def run(self, what: str, work: Callable[[], None]) -> None:
        """Run ``work`` here, logging and counting a failure instead of raising it."""
        try:
            work()
        except Exception:
            self.count_failure()
            log.exception("%s failed (the answer stands; the session's next turn may miss cache)", what)

    def flush(self, timeout_s: float) -> bool:
        """Wait, at most timeout_s, until the work submitted so far has run (one thread, in order:
        a marker queued behind it). A stopping worker calls it once its KV writer has written
        through, so its last turns' records and pins are in Redis before the process exits.
        False if it timed out."""
        with self._lock:
            if self._thread is None:
                return True
        done = threading.Event()
        self._queue.put(done.set)
        return done.wait(timeout_s)

    def count_failure(self) -> None:
        with self._lock:
            self.failures += 1

    def _run(self) -> None:
        while True:
            self.run("a turn's session bookkeeping", self._queue.get())
