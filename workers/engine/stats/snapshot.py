"""Engine figures: step counters and the memory breakdown, as typed snapshots."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kvstore.pool.stats import PoolStats


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    weights_bytes: int
    pool_bytes: int
    used_bytes: int  # blocks referenced by running requests
    cached_bytes: int  # unreferenced blocks kept for prefix hits
    free_bytes: int

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class EngineStats:
    model_id: str
    bytes_per_block: int
    pool: PoolStats
    memory: MemoryBreakdown
    num_steps: int
    num_preemptions: int
    num_running: int
    num_waiting: int
    max_batch_seqs: int  # most sequences run in one step so far
    max_batch_tokens: int
    prompt_tokens_computed: int
    generation_tokens: int
    # Wall seconds of decode-only steps and of steps with prefill rows; steps the admission hold
    # kept new prompts out of (workers/engine/scheduling/step_cost.py, scheduler.py).
    seconds_decode_only: float = 0.0
    seconds_with_prefill: float = 0.0
    num_held_steps: int = 0
    prefill_tokens_pending: int = 0  # prompt tokens of running sequences not computed yet
    blocks_kept: int = 0  # of pool.blocks_used: kept session tails (workers/engine/tiers/kept_tails.py)
    oldest_waiting_s: float = 0.0  # the longest a waiting sequence not started yet has waited
    dtype: str = "float32"  # weights and GEMMs, or int8 (workers/engine/model/precision.py)
    kv_cache_dtype: str = "float32"  # the hot pool's K/V

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k not in ("pool", "memory")}
        out["pool"] = self.pool.to_dict()
        out["memory_breakdown"] = self.memory.to_dict()
        return out
