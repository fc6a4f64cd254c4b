"""The api's background loops (the dispatcher, api/dispatch/; the batch runner, api/batches/): how
they stop at shutdown, and how they log a failing pass (a Redis outage fails every pass: the first
failure is a warning, the rest of the streak debug lines, and its end one line)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

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
    """Also counted: `failures` (every failed pass) and `failing` (a streak now), which /metrics
    shows (kvferry_background_failures_total, kvferry_background_failing)."""

    def __init__(self, what: str, logger: logging.Logger) -> None:
        self.what = what
        self.log = logger
        self.since: float | None = None  # when the current streak of failed passes began
        self.failures = 0

    @property
    def failing(self) -> bool:
        return self.since is not None

    def failed(self, exc: BaseException, expected: bool = True) -> None:
        """expected: an outage (Redis down); else a bug, logged with its traceback."""
        self.failures += 1
        if self.since is None:
            self.since = time.monotonic()
            self.log.warning(
                "%s pass failed: %s: %s (retrying every pass)",
                self.what,
                type(exc).__name__,
                exc,
                exc_info=None if expected else exc,
            )
        else:
            self.log.debug("%s pass failed again: %s", self.what, exc)

    def passed(self) -> None:
        if self.since is not None:
            self.log.warning(
                "%s passes again after %.1fs of failures", self.what, time.monotonic() - self.since
            )
            self.since = None


class BackgroundCollector(Collector):
    """The loops' FailureLogs on /metrics, by loop: a loop failing for a reason other than an
    outage (a bug) shows here as well as in the log."""

    def __init__(self) -> None:
        self.logs: dict[str, FailureLog] = {}

    def watch(self, loop: str, failures: FailureLog) -> None:
        self.logs[loop] = failures

    def collect(self) -> Iterator[Metric]:
        total = CounterMetricFamily(
            "kvferry_background_failures", "Failed passes of the api's background loops", labels=["loop"]
        )
        failing = GaugeMetricFamily(
            "kvferry_background_failing", "1 while a background loop's passes fail", labels=["loop"]
        )
        for loop, failures in sorted(self.logs.items()):
            total.add_metric([loop], failures.failures)
            failing.add_metric([loop], int(failures.failing))
        yield total
        yield failing
