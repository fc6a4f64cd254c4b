"""The api's background loops (the dispatcher, api/dispatch/; the batch runner, api/batches/): how
they stop at shutdown, and how they log a failing pass (a Redis outage fails every pass: the first
failure is a warning, the rest of the streak debug lines, and its end one line)."""

from __future__ import annotations

import asyncio
import logging
import time

log = logging.getLogger(__name__)
STOP_WAIT_S = 2.0  # the background loops stopping at shutdown: at most this long, all together


async def stop_tasks(*tasks: asyncio.Task[None], wait_s: float = STOP_WAIT_S) -> None:
    """Cancel background loops and wait for them, a bounded while: a shutdown never hangs."""
    for task in tasks:
        task.cancel()
    _, pending = await asyncio.wait(set(tasks), timeout=wait_s)
    for task in pending:
        log.error("%s did not stop within %gs of its cancel", task.get_name(), wait_s)


class FailureLog:
    def __init__(self, what: str, logger: logging.Logger) -> None:
        self.what = what
        self.log = logger
        self.since: float | None = None  # when the current streak of failed passes began

    def failed(self, exc: BaseException) -> None:
        if self.since is None:
            self.since = time.monotonic()
            self.log.warning(
                "%s pass failed: %s: %s (retrying every pass)", self.what, type(exc).__name__, exc
            )
        else:
            self.log.debug("%s pass failed again: %s", self.what, exc)

    def passed(self) -> None:
        if self.since is not None:
            self.log.warning(
                "%s passes again after %.1fs of failures", self.what, time.monotonic() - self.since
            )
            self.since = None
