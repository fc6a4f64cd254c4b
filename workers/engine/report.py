"""An engine's figures and invariants, read between steps: stats, memory, integrity."""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers.engine.block_manager import cdiv
from workers.engine.stats import EngineStats, MemoryBreakdown

if TYPE_CHECKING:
    from workers.engine.llm_engine import LLMEngine


def memory_breakdown(engine: LLMEngine) -> MemoryBreakdown:
    stats = engine.pool.stats()
    per = engine.layout.bytes_per_block
    return MemoryBreakdown(
        weights_bytes=engine.weights_bytes,
        pool_bytes=engine.kv_cache.nbytes,
        used_bytes=stats.blocks_used * per,
        cached_bytes=stats.blocks_cached * per,
        free_bytes=stats.blocks_free * per,
    )


def engine_stats(engine: LLMEngine) -> EngineStats:
    counters = engine.counters
    return EngineStats(
        model_id=engine.model_id,
        bytes_per_block=engine.layout.bytes_per_block,
        pool=engine.pool.stats(),
        memory=memory_breakdown(engine),
        num_steps=counters.num_steps,
        num_preemptions=engine.scheduler.num_preemptions,
        num_running=len(engine.scheduler.running),
        num_waiting=len(engine.scheduler.waiting),
        max_batch_seqs=counters.max_batch_seqs,
        max_batch_tokens=counters.max_batch_tokens,
        prompt_tokens_computed=counters.prompt_tokens_computed,
        generation_tokens=engine.post.generation_tokens,
    )


def check_integrity(engine: LLMEngine) -> None:
    """Pool invariants, plus: every running sequence's blocks are referenced and sized right."""
    pool, scheduler = engine.pool, engine.scheduler
    pool.check_integrity()
    for seq in scheduler.running:
        assert len(seq.block_ids) >= cdiv(seq.num_computed_tokens, pool.block_size), seq.request_id
        assert all(pool.blocks[b].ref_cnt > 0 for b in seq.block_ids), seq.request_id
    for seq in scheduler.waiting:
        assert not seq.block_ids, seq.request_id
    if not engine.has_unfinished():
        kept = len(engine.block_manager.tails)  # partial blocks of finished session turns
        assert pool.stats().blocks_used == kept, "blocks leaked after all requests finished"
