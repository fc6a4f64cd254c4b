"""The simulated engine: a load-test mode that keeps the whole job path (Celery task, leases, the
fenced stream, sessions, heartbeats, maintenance) and replaces only the model. No torch is
imported, so dozens of worker processes fit on one machine (`kvferry bench fleet`).

It is asked for by name only: KVFERRY_ENGINE=simulated (or `kvferry worker --engine simulated`)
together with the model name "simulated"; either alone is refused (workers/jobs/engine_service.py).

SimulatedLoop implements the Loop protocol (workers/loop/protocol.py), as EngineLoop does: what the
job path uses of a loop (tokenizer, grammars, submit -> RequestHandle, healthy, idle, latest_stats,
block_size, fingerprint). One thread steps every running request by one token each `token_delay_s`, as a
batched engine would. Tokens are deterministic: the i-th output token of a prompt is a lowercase
letter fixed by the prompt and i, so a resumed request continues exactly. The tokenizer is a byte
tokenizer (one id per UTF-8 byte).
"""

from __future__ import annotations

import threading
import zlib
from dataclasses import dataclass, field
from typing import Any

from broker.errors import InvalidRequestError, KvferryError
from kvstore.pool.stats import PoolStats
from workers.background import BackgroundThread
from workers.engine.errors import EngineFailedError
from workers.engine.requests.output import RequestOutput
from workers.engine.requests.request import GenerationRequest
from workers.engine.stats.snapshot import EngineStats, MemoryBreakdown
from workers.loop.handle import RequestHandle
from workers.loop.idle_event import IdleEvent

MODEL = "simulated"  # the model name that, with KVFERRY_ENGINE=simulated, selects this engine
ALPHABET = 26


class SimulatedEngineRefusedError(KvferryError):
    """The simulated engine asked for by one of its two names only."""


@dataclass(frozen=True, slots=True)
class SimulatedEngine:
    token_delay_s: float
    default_max_tokens: int = 16


def choose(engine: str, model: str, token_delay_s: float, default_max_tokens: int) -> SimulatedEngine | None:
    """The simulated engine if both the engine setting and the model name ask for it, None if
    neither does; either alone is refused (a normal start never gets a fake model)."""
    if engine == "simulated" and model == MODEL:
        return SimulatedEngine(token_delay_s, default_max_tokens)
    if engine == "simulated":
        raise SimulatedEngineRefusedError(
            f"the simulated engine serves only the model {MODEL!r}, not {model!r}: pass --model {MODEL}"
        )
    if model == MODEL:
        raise SimulatedEngineRefusedError(
            f"{MODEL!r} is the load-test engine: ask for it by name, KVFERRY_ENGINE=simulated "
            "(--engine simulated)"
        )
    return None


class ByteTokenizer:
    """One token per UTF-8 byte; a chat renders as "role: content" lines."""

    chat_template = "simulated"

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": list(text.encode("utf-8"))}

    def decode(self, ids: Any, skip_special_tokens: bool = False, **_: Any) -> str:
        return bytes(int(i) % 256 for i in ids).decode("utf-8", errors="replace")

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tokenize: bool = True,
        **_: Any,
    ) -> Any:
        text = "".join(f"{m.get('role')}: {m.get('content')}\n" for m in messages) + "assistant: "
        return self(text)["input_ids"] if tokenize else text

    def get_added_vocab(self) -> dict[str, int]:
        return {}


class NoGrammars:
    def compile(self, spec: Any) -> None:
        if spec is not None:
            raise InvalidRequestError("the simulated engine has no structured outputs", "response_format")


@dataclass
class _Running:
    handle: RequestHandle
    seed: int
    prompt_tokens: int
    max_tokens: int
    tokens: list[int] = field(default_factory=list)
    chars: int = 0


class SimulatedLoop:
    def __init__(self, token_delay_s: float, default_max_tokens: int = 16, block_size: int = 16) -> None:
        self.token_delay_s = token_delay_s
        self.default_max_tokens = default_max_tokens
        self.tokenizer = ByteTokenizer()
        self.grammars = NoGrammars()
        self.block_size = block_size
        self.fingerprint = MODEL
        self.resident = None
        self.idle = IdleEvent()
        self.idle.set()
        self.restarts = 0
        self.failure: BaseException | None = None
        self.generated = 0
        self._running: dict[str, _Running] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = BackgroundThread("kvferry-simulated-engine", self._run)
        self._thread.start()  # assigned first: its body reads it

    @property
    def healthy(self) -> bool:
        return self._thread.alive and not self._thread.stopped

    @property
    def latest_stats(self) -> EngineStats:
        with self._lock:
            running = len(self._running)
        pool = PoolStats(self.block_size, 1, 0, 0, 1, 0, 0, 0, 0.0)
        return EngineStats(
            MODEL, 0, pool, MemoryBreakdown(0, 0, 0, 0, 0), 0, 0, running, 0, running, 0, 0, self.generated
        )

    def submit(self, request: GenerationRequest) -> RequestHandle:
        rid, prompt, max_tokens = request.request_id, request.prompt_token_ids, request.params.max_tokens
        handle = RequestHandle(rid, self.abort, reports_first_out=False)
        seed = zlib.crc32(bytes(int(t) % 256 for t in prompt))
        run = _Running(handle, seed, len(prompt), max_tokens or self.default_max_tokens)
        run.tokens, run.chars = list(request.output_token_ids), request.streamed_chars
        with self._lock:
            self._running[rid] = run
        self.idle.clear()
        self._wake.set()
        return handle

    def warm(self, blocks: list[Any], at_request: bool = True) -> None:
        return None  # no tiers: a prefetch never runs here

    def abort(self, request_id: str) -> None:
        with self._lock:
            run = self._running.pop(request_id, None)
        if run is not None:
            run.handle._publish(self._output(run, (), "abort"))

    def stop(self, timeout: float = 10.0) -> None:
        self._thread.stopping.set()
        self._wake.set()  # the thread may be waiting for work, not for the stop
        self._thread.stop(join_s=timeout)

    def check_integrity(self, timeout: float | None = None) -> None:
        return None

    def _token(self, run: _Running, index: int) -> int:
        return ord("a") + (run.seed + 7 * index) % ALPHABET

    def _output(self, run: _Running, delta: tuple[int, ...], reason: Any) -> RequestOutput:
        text = self.tokenizer.decode(run.tokens)
        delta_text = self.tokenizer.decode(delta)
        return RequestOutput(
            run.handle.request_id,
            delta,
            delta_text,
            reason is not None,
            reason,
            tuple(run.tokens),
            text,
            run.prompt_tokens,
            0,
            text_start=len(text) - len(delta_text),
        )

    def _step(self) -> None:
        with self._lock:
            runs = list(self._running.values())
        for run in runs:
            if len(run.tokens) >= run.max_tokens:  # resumed with every token already streamed
                with self._lock:
                    self._running.pop(run.handle.request_id, None)
                run.handle._publish(self._output(run, (), "length"))
                continue
            token = self._token(run, len(run.tokens))
            run.tokens.append(token)
            done = len(run.tokens) >= run.max_tokens
            if done:
                with self._lock:
                    self._running.pop(run.handle.request_id, None)
            run.handle._publish(self._output(run, (token,), "length" if done else None))
        self.generated += len(runs)

    def _run(self) -> None:
        while not self._thread.stopped:
            if not self._running:
                self.idle.set()
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            self._thread.wait(self.token_delay_s)
            self._step()
        with self._lock:
            runs, self._running = list(self._running.values()), {}
        for run in runs:
            run.handle._fail(EngineFailedError("the simulated engine stopped"))
