"""The queue waits of the jobs this api saw start lately, for the policy's wait p95."""

from __future__ import annotations

import math
import threading
from collections import deque


class WaitWindow:
    def __init__(self, window_s: float = 60.0, cap: int = 4096) -> None:
        self.window_s = window_s
        self._waits: deque[tuple[float, float]] = deque(maxlen=cap)  # (when observed, seconds)
        self._lock = threading.Lock()  # the batch collector observes from its own task

    def observe(self, now: float, seconds: float) -> None:
        with self._lock:
            self._waits.append((now, max(0.0, seconds)))

    def p95(self, now: float) -> float | None:
        """The 95th percentile (nearest rank) of the waits observed in the window; None if none."""
        with self._lock:
            while self._waits and self._waits[0][0] < now - self.window_s:
                self._waits.popleft()
            waits = sorted(s for _, s in self._waits)
        if not waits:
            return None
        return waits[min(len(waits) - 1, math.ceil(0.95 * len(waits)) - 1)]
