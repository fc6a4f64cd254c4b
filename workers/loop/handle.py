"""RequestHandle: a submitted request, as its submitter sees it (a stream, then a result)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

from workers.engine.requests.output import RequestOutput

_STREAM_END = object()


class RequestHandle:
    """A submitted request: iterate it for deltas as they are made, or wait for the final output."""

    def __init__(
        self, request_id: str, abort: Callable[[str], None], reports_first_out: bool = False
    ) -> None:
        self.request_id = request_id
        self._abort = abort  # the loop's abort: the engine drops the request and frees its blocks
        self._deltas: queue.Queue[Any] = queue.Queue()
        self._future: Future[RequestOutput] = Future()
        # A consumer that calls first_out() once it has passed the first token on: the loop then
        # holds its next step for it (wait_for_first_out).
        self.reports_first_out = reports_first_out
        self._first_out = threading.Event()
        self._gave_tokens = False

    def _publish(self, out: RequestOutput) -> bool:
        """Hand ``out`` to the consumer; True if the loop should wait for first_out() now (the
        request's first tokens, more to come, and a consumer that reports)."""
        first = bool(out.delta_token_ids) and not self._gave_tokens
        self._gave_tokens = self._gave_tokens or first
        self._deltas.put(out)
        if out.finished:
            self._deltas.put(_STREAM_END)
            self._future.set_result(out)
        return first and not out.finished and self.reports_first_out

    def first_out(self) -> None:
        """Called by the consumer once the first token has left (published): the loop steps on."""
        self._first_out.set()

    def _wait_first_out(self, timeout: float) -> bool:
        return self._first_out.wait(timeout)

    def _fail(self, exc: BaseException) -> None:
        if not self._future.done():
            self._deltas.put(exc)
            self._deltas.put(_STREAM_END)
            self._future.set_exception(exc)

    def __iter__(self) -> Iterator[RequestOutput]:
        while True:
            item = self._deltas.get()
            if item is _STREAM_END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def result(self, timeout: float | None = None) -> RequestOutput:
        return self._future.result(timeout)

    def done(self) -> bool:
        return self._future.done()

    def cancel(self) -> None:
        self._abort(self.request_id)


def wait_for_first_out(handles: Sequence[RequestHandle], wait_s: float) -> None:
    """After a step that gave these reporting handles their first tokens: wait until each consumer
    has passed its token on, ``wait_s`` at most in all (EngineConfig.first_token_hold_s). The next
    step would otherwise fill the cores while the token crosses the task thread, Redis and the api
    (docs/benchmarks.md has the A/B)."""
    deadline = time.monotonic() + wait_s
    for handle in handles:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        handle._wait_first_out(left)
