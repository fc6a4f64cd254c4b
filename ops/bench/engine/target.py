"""EngineTarget: an engine driven on one thread with no loop (the benchmarks and engine tests),
as a prefetch target (workers/tiers/prefetch.py): the loop's facts, read from the engine itself."""

from __future__ import annotations

from workers.engine.llm_engine import LLMEngine


class EngineTarget:
    def __init__(self, engine: LLMEngine) -> None:
        self.block_size = engine.pool.block_size
        self.fingerprint = engine.served.loaded.fingerprint
        self.resident = engine.tiers.resident if engine.tiers is not None else None
        self.warm = engine.admit_prefetched
