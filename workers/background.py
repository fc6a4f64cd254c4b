"""BackgroundThread: a named daemon thread and the event that asks it to stop, started and
stopped the same way everywhere in the worker (heartbeat, supervisor, leases, maintenance,
prefetch hints, the KV writer, the session bookkeeping, the simulated engine).

The thread's body loops until `stopping` is set, usually as `while not bg.wait(interval_s): ...`
(wait returns True once asked to stop). Daemon threads: a process that exits never waits for one."""

from __future__ import annotations

import threading
from collections.abc import Callable


class BackgroundThread:
    def __init__(self, name: str, body: Callable[[], None]) -> None:
        self.name = name
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=body, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wait(self, seconds: float | None) -> bool:
        """Sleep up to `seconds`; True once asked to stop (at once, if it already was)."""
        return self.stopping.wait(seconds)

    @property
    def stopped(self) -> bool:
        return self.stopping.is_set()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, join_s: float | None = 5.0) -> None:
        """Ask the thread to stop; wait up to `join_s` for it to end (None: do not wait)."""
        self.stopping.set()
        thread = self._thread
        if join_s is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(join_s)
