"""Loop: what the job path uses of an engine loop. EngineLoop (workers/loop/engine_loop.py) and
the load-test SimulatedLoop (workers/loop/simulated.py) both implement it; EngineService.loop()
hands out one or the other, and no caller needs to know which."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # torch's: a worker in the simulated mode never loads them
    from kvstore.tiers.stored_block import StoredBlock
    from workers.engine.grammar.matcher import CompiledGrammar
    from workers.engine.requests.request import GenerationRequest
    from workers.engine.stats.snapshot import EngineStats
    from workers.engine.tiers.resident import ResidentBlocks
    from workers.loop.handle import RequestHandle
    from workers.loop.idle_event import IdleEvent


class Grammars(Protocol):
    def compile(self, spec: Any) -> CompiledGrammar | None: ...


class Loop(Protocol):
    """Read-only members: fixed once the loop is built, so any thread may read them."""

    tokenizer: Any
    block_size: int
    fingerprint: str
    idle: IdleEvent  # set while the loop has nothing to run (the KV writer waits for it)
    failure: BaseException | None  # what stopped the loop, if anything did

    @property
    def grammars(self) -> Grammars: ...  # thread-safe: task threads compile before they submit

    @property
    def resident(self) -> ResidentBlocks | None: ...  # which blocks this worker holds (no tiers: None)

    @property
    def healthy(self) -> bool: ...

    @property
    def restarts(self) -> int: ...

    @property
    def latest_stats(self) -> EngineStats | None: ...

    def submit(self, request: GenerationRequest) -> RequestHandle: ...

    def abort(self, request_id: str) -> None: ...

    def warm(self, blocks: list[StoredBlock], at_request: bool = True) -> None: ...

    def check_integrity(self, timeout: float | None = 30.0) -> None: ...

    def stop(self, timeout: float = 10.0) -> None: ...
