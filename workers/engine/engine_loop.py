"""EngineLoop: the one thread that owns an engine; any thread may submit to it."""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from broker.sampling import SamplingParams
from workers.engine.llm_engine import LLMEngine
from workers.engine.request_output import RequestOutput

log = logging.getLogger(__name__)
T = TypeVar("T")
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


@dataclass(frozen=True, slots=True)
class _Submit:
    handle: RequestHandle
    prompt_token_ids: list[int]
    params: SamplingParams
    cache_salt: str
    output_token_ids: list[int]
    streamed_chars: int


@dataclass(frozen=True, slots=True)
class _Abort:
    request_id: str


@dataclass(frozen=True, slots=True)
class _Call:
    fn: Callable[[LLMEngine], Any]
    future: Future[Any]


class EngineLoop:
    """Concurrent submitters are batched together: every step takes whatever has arrived."""

    def __init__(self, engine: LLMEngine, name: str = "kvferry-engine") -> None:
        self.engine = engine
        self._inbox: queue.Queue[_Submit | _Abort | _Call | None] = queue.Queue()
        self._handles: dict[str, RequestHandle] = {}
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._stopped = threading.Event()

    def start(self) -> EngineLoop:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._inbox.put(None)
        self._thread.join(timeout)

    def __enter__(self) -> EngineLoop:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def submit(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        cache_salt: str = "",
        output_token_ids: tuple[int, ...] = (),
        streamed_chars: int = 0,
    ) -> RequestHandle:
        """Queue a request (see LLMEngine.add_request); errors arrive through the handle."""
        handle = RequestHandle(request_id or f"req-{uuid.uuid4().hex[:12]}-{next(self._ids)}", self)
        if self._stopped.is_set():
            handle._fail(RuntimeError("the engine loop has stopped"))
            return handle
        self._inbox.put(
            _Submit(
                handle, list(prompt_token_ids), params, cache_salt, list(output_token_ids), streamed_chars
            )
        )
        return handle

    def abort(self, request_id: str) -> None:
        self._inbox.put(_Abort(request_id))

    def call(self, fn: Callable[[LLMEngine], T], timeout: float | None = 30.0) -> T:
        """Run fn(engine) on the loop thread, between steps (figures, integrity checks)."""
        future: Future[T] = Future()
        self._inbox.put(_Call(fn, future))
        return future.result(timeout)

    # -- the loop thread ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._drain(block=not self.engine.has_unfinished()):
                if self.engine.has_unfinished():
                    self._step()
        finally:
            self._stopped.set()
            for handle in list(self._handles.values()):
                handle._fail(RuntimeError("the engine loop stopped"))
            self._handles.clear()

    def _drain(self, block: bool) -> bool:
        """Handle every waiting message (waiting for one when idle); False once asked to stop."""
        try:
            msg = self._inbox.get(block=block)
            while msg is not None:
                self._handle(msg)
                msg = self._inbox.get_nowait()
            return False
        except queue.Empty:
            return True

    def _handle(self, msg: _Submit | _Abort | _Call) -> None:
        if isinstance(msg, _Submit):
            rid = msg.handle.request_id
            try:
                self.engine.add_request(
                    rid,
                    msg.prompt_token_ids,
                    msg.params,
                    msg.cache_salt,
                    msg.output_token_ids,
                    msg.streamed_chars,
                )
            except Exception as exc:  # typed errors go back to the submitter, nothing queued
                msg.handle._fail(exc)
                return
            self._handles[rid] = msg.handle
        elif isinstance(msg, _Abort):
            out = self.engine.abort_request(msg.request_id)
            handle = self._handles.pop(msg.request_id, None)
            if out is not None and handle is not None:
                handle._publish(out)
        elif isinstance(msg, _Call):
            try:
                msg.future.set_result(msg.fn(self.engine))
            except Exception as exc:
                msg.future.set_exception(exc)
        else:
            raise TypeError(f"unknown engine message {type(msg).__name__}")

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as exc:
            log.exception("engine step failed; failing the requests in flight")
            for rid, failed in list(self._handles.items()):
                self.engine.abort_request(rid)
                failed._fail(exc)
            self._handles.clear()
            return
        for out in outputs:
            target = (
                self._handles.pop(out.request_id, None) if out.finished else self._handles.get(out.request_id)
            )
            if target is not None:
                target._publish(out)
