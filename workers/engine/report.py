"""EngineReport: an engine's figures and invariants, read between steps from the parts it was
built with (stats, memory, integrity); it never holds the engine itself."""

from __future__ import annotations

from dataclasses import dataclass

from kvstore.layout import KVLayout
from kvstore.pool.block_pool import BlockPool
from kvstore.pool.kv_cache import KVCache
from workers.engine.block_manager import BlockManager, cdiv
from workers.engine.postprocess import Postprocessor
from workers.engine.scheduler import Scheduler
from workers.engine.stats import EngineStats, MemoryBreakdown
from workers.engine.step_counters import StepCounters


@dataclass(frozen=True, slots=True)
class EngineReport:
    model_id: str
    weights_bytes: int  # counted once, after the runner packed the linears
    layout: KVLayout
    kv_cache: KVCache
    pool: BlockPool
    block_manager: BlockManager
    scheduler: Scheduler
    post: Postprocessor
    counters: StepCounters
    dtype: str = "float32"  # the weights' and GEMMs' (model/precision.py); the pool's is layout.dtype

    def memory(self) -> MemoryBreakdown:
        stats = self.pool.stats()
        per = self.layout.bytes_per_block
        return MemoryBreakdown(
            weights_bytes=self.weights_bytes,
            pool_bytes=self.kv_cache.nbytes,
            used_bytes=stats.blocks_used * per,
            cached_bytes=stats.blocks_cached * per,
            free_bytes=stats.blocks_free * per,
        )

    def stats(self) -> EngineStats:
        counters = self.counters
        return EngineStats(
            model_id=self.model_id,
            bytes_per_block=self.layout.bytes_per_block,
            pool=self.pool.stats(),
            memory=self.memory(),
            num_steps=counters.num_steps,
            num_preemptions=self.scheduler.num_preemptions,
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            max_batch_seqs=counters.max_batch_seqs,
            max_batch_tokens=counters.max_batch_tokens,
            prompt_tokens_computed=counters.prompt_tokens_computed,
            generation_tokens=self.post.generation_tokens,
            seconds_decode_only=self.scheduler.cost.seconds_decode_only,
            seconds_with_prefill=self.scheduler.cost.seconds_with_prefill,
            num_held_steps=self.scheduler.num_held_steps,
            prefill_tokens_pending=sum(
                max(0, s.num_prompt_tokens - s.num_computed_tokens) for s in self.scheduler.running
            ),
            dtype=self.dtype,
            kv_cache_dtype=str(self.layout.dtype).removeprefix("torch."),
        )

    def check_integrity(self, idle: bool) -> None:
        """Pool invariants, plus: every running sequence's blocks are referenced and sized right;
        once `idle` (no request unfinished), only kept session tails hold blocks."""
        pool, scheduler = self.pool, self.scheduler
        pool.check_integrity()
        for seq in scheduler.running:
            assert len(seq.block_ids) >= cdiv(seq.num_computed_tokens, pool.block_size), seq.request_id
            assert all(pool.blocks[b].ref_cnt > 0 for b in seq.block_ids), seq.request_id
        for seq in scheduler.waiting:
            assert not seq.block_ids, seq.request_id
        if idle:
            kept = len(self.block_manager.tails)  # partial blocks of finished session turns
            assert pool.stats().blocks_used == kept, "blocks leaked after all requests finished"
