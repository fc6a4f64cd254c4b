"""EngineYield: when the KV writer may start its next transaction.

On 2 cores, a write-through running beside an engine step (packing, the socket copies, and Redis
taking in the bytes) takes the cores the step needs, and a cached prompt's TTFT right after a long
turn pays for it (docs/benchmarks.md). So the writer starts a transaction only once the engine has
been idle for QUIET_S (EngineLoop.idle), waiting at most ``defer_s`` per batch, and not at all
while ``hurry()`` says so (a full queue, a flush, a stop). The settling time is for the next
request of the same client, which often follows a turn's end at once: through the API it reaches
the engine well within QUIET_S of the turn's last token, and a write started in that gap delays
its TTFT. Under steady load writes trail by at most ``defer_s``, and still go through. Used by the
writer thread only.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from workers.loop.idle_event import IdleEvent

RECHECK_S = 0.05  # while waiting: how often hurry() is asked again
QUIET_S = 0.05  # how long the engine must have been idle before a transaction starts


class EngineYield:
    def __init__(self, defer_s: float = 0.0, idle: IdleEvent | None = None) -> None:
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
        """Return once the engine has been idle QUIET_S, ``deadline`` has passed, or hurry() is true."""
        idle = self.idle
        if idle is None or idle.idle_for() >= QUIET_S or time.monotonic() >= deadline or hurry():
            return
        started = time.monotonic()
        while not hurry():
            left = deadline - time.monotonic()
            quiet_left = QUIET_S - idle.idle_for()
            if left <= 0 or quiet_left <= 0:
                break
            if idle.is_set():  # settling: a submit in the meantime clears it again
                time.sleep(min(quiet_left, left))
            else:
                idle.wait(min(RECHECK_S, left))
        self.yields += 1
        self.yielded_s += time.monotonic() - started
