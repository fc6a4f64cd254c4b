"""RequestHandle: a submitted request, as its submitter sees it (a stream, then a result)."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from workers.engine.request_output import RequestOutput

if TYPE_CHECKING:
    from workers.engine.engine_loop import EngineLoop

_STREAM_END = object()


class RequestHandle:
    """A submitted request: iterate it for deltas as they are made, or wait for the final output."""

    def __init__(self, request_id: str, loop: EngineLoop) -> None:
        self.request_id = request_id
        self._loop = loop
        self._deltas: queue.Queue[Any] = queue.Queue()
        self._future: Future[RequestOutput] = Future()

    def _publish(self, out: RequestOutput) -> None:
        self._deltas.put(out)
        if out.finished:
            self._deltas.put(_STREAM_END)
            self._future.set_result(out)

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
        self._loop.abort(self.request_id)
