"""InteractivePresence: every worker sizes its batch steps while interactive requests flow on any
worker of the fleet (workers/engine/scheduling/batch_budget.py), not only on itself.

An interactive request that arrives mid-step waits out the step in flight. A worker sized its
batch steps only while its own interactive requests flowed, so one routed to a worker whose
last interactive request went elsewhere found a full batch step in flight: on the 2-worker
`kvferry bench batch`, the step a probe arrived in carried 31 of 32 batch rows (p50). Now, while
a worker runs interactive jobs and when one ends, it sets keys.INTERACTIVE_FLOWING with a TTL of
the sizer's linger, and a thread of each worker reads that TTL every POLL_S and tells its loop
until when the fleet's interactive traffic counts as flowing (the same linger as its own: from
the last one's end). Best effort: a Redis error costs sized steps, never a job."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from broker import keys
from workers.background import BackgroundThread

log = logging.getLogger(__name__)
POLL_S = 0.1  # how stale a worker's view of the fleet may be; a running job's mark is renewed as often


class InteractivePresence:
    def __init__(self, client: redis.Redis, linger_s: float, flows_until: Callable[[float], None]) -> None:
        """`flows_until(deadline)`: the loop's, on time.monotonic()'s clock."""
        self.redis = client
        self.linger_ms = int(linger_s * 1000)
        self.flows_until = flows_until
        self.running = 0  # interactive jobs running on this worker
        self._lock = threading.Lock()
        self._thread = BackgroundThread("kvferry-interactive-presence", self._run)

    def begin(self) -> None:
        """An interactive job starts on this worker (any job thread); the poll marks it."""
        with self._lock:
            self.running += 1

    def end(self) -> None:
        """It ended: the fleet's linger starts now."""
        with self._lock:
            self.running -= 1
        try:
            self._mark()
        except (redis.RedisError, OSError) as exc:
            log.debug("could not mark interactive traffic: %s", exc)

    def _mark(self) -> None:
        self.redis.set(keys.INTERACTIVE_FLOWING, 1, px=self.linger_ms)

    def poll(self) -> None:
        if self.running > 0:
            self._mark()
        left_ms = int(self.redis.pttl(keys.INTERACTIVE_FLOWING))  # -2: gone, -1: no TTL (never set so)
        if left_ms > 0:
            self.flows_until(time.monotonic() + left_ms / 1000)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()

    def _run(self) -> None:
        while not self._thread.wait(POLL_S):
            try:
                self.poll()
            except (redis.RedisError, OSError) as exc:
                log.debug("could not read the fleet's interactive traffic: %s", exc)
