"""IdleEvent: set while the engine loop waits with nothing to run, and since when.

The KV writer reads it (workers/tiers/writer_yield.py): it starts a transaction only once the engine has
been idle a little while, since a turn's end is often followed at once by the next request of the
same client (an agent's next step, a chat's follow-up), and a write-through running beside that
request's prefill takes the cores its thread team needs.
"""

from __future__ import annotations

import threading
import time


class IdleEvent(threading.Event):
    def __init__(self) -> None:
        super().__init__()
        self.since = 0.0  # time.monotonic() when it was last set from clear; 0: long ago
        self._flip = threading.Lock()  # set/clear and ``since`` change together

    def set(self) -> None:
        with self._flip:
            if not self.is_set():
                self.since = time.monotonic()  # before set(): whoever sees it set sees this time
            super().set()

    def clear(self) -> None:
        with self._flip:
            super().clear()

    def set_long_ago(self) -> None:
        """Set, as if idle for ever (a stopped loop: nothing will run, nobody should wait)."""
        with self._flip:
            self.since = 0.0
            super().set()

    def idle_for(self) -> float:
        """Seconds the engine has been idle; 0.0 while it is not. Checked before ``since`` is read:
        a set in between gives a fresher ``since``, so never too long an answer."""
        if not self.is_set():
            return 0.0
        return time.monotonic() - self.since
