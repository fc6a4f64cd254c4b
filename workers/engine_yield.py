"""EngineYield: when the KV writer may start its next transaction.

On 2 cores, a write-through running beside an engine step (packing, the socket copies, and Redis
taking in the bytes) doubled a cached prompt's TTFT right after a long turn. So the writer starts a
transaction only while the engine is idle (EngineLoop.idle set), waiting at most ``defer_s`` per
batch, and not at all while ``hurry()`` says so (a full queue, a flush, a stop). Under steady load
writes trail by at most ``defer_s``, and still go through. Used by the writer thread only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

RECHECK_S = 0.05  # while waiting: how often hurry() is asked again


class EngineYield:
    def __init__(self, defer_s: float = 0.0, idle: threading.Event | None = None) -> None:
        if defer_s < 0:
            raise ValueError(f"defer_s must be >= 0, got {defer_s}")
        self.defer_s = defer_s
        self.idle = idle  # EngineLoop.idle; None: never wait
        self.yields = 0  # transactions that waited for the engine
        self.yielded_s = 0.0

    def deadline(self) -> float:
        """For a batch starting now: the latest it waits until."""
        return time.monotonic() + self.defer_s

    def wait(self, deadline: float, hurry: Callable[[], bool]) -> None:
        """Return once the engine is idle, ``deadline`` has passed, or hurry() is true."""
        idle = self.idle
        if idle is None or idle.is_set() or time.monotonic() >= deadline or hurry():
            return
        started = time.monotonic()
        while not idle.is_set() and not hurry():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            idle.wait(min(RECHECK_S, left))
        self.yields += 1
        self.yielded_s += time.monotonic() - started
