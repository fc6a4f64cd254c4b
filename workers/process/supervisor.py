"""Supervisor: a worker whose engine loop stays unhealthy (its thread died, or a restart never
finished) must not keep taking jobs, so past a grace period the process exits. Its unacked jobs
then come back through the reaper of another worker (or at once, when it restarts under the same
name), and resume from their streams. A loop that restarts after a failed step is unhealthy for
far less than the grace period."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from workers.background import BackgroundThread
from workers.jobs.engine_service import EngineService

log = logging.getLogger(__name__)
EXIT_CODE = 70  # EX_SOFTWARE: compose (restart: always) or `kvferry serve` starts it again


class Supervisor:
    def __init__(
        self,
        service: EngineService,
        grace_s: float = 10.0,
        check_s: float = 0.5,
        exit_fn: Callable[[int], None] = os._exit,
    ) -> None:
        self.service = service
        self.grace_s = grace_s
        self.check_s = check_s
        self.exit_fn = exit_fn
        self._unhealthy_since: float | None = None
        self._thread = BackgroundThread("kvferry-supervisor", self._run)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()

    def check(self, now: float | None = None) -> bool:
        """One look; True when it decided to exit."""
        now = time.monotonic() if now is None else now
        loop = self.service.current_loop
        broken = self.service.load_error is not None and loop is None  # its engine cannot be built
        if not broken and (loop is None or loop.healthy):
            self._unhealthy_since = None
            return False
        if self._unhealthy_since is None:
            self._unhealthy_since = now
            log.warning("the engine loop is unhealthy")
        if now - self._unhealthy_since < self.grace_s:
            return False
        log.critical(
            "the engine loop has been unhealthy for %.0fs (%r); exiting so its jobs are redelivered",
            now - self._unhealthy_since,
            getattr(loop, "failure", None) or self.service.load_error,
        )
        self.exit_fn(EXIT_CODE)
        return True

    def _run(self) -> None:
        while not self._thread.wait(self.check_s):
            if self.check():
                return
