"""EngineReport: the engine's figures, step counters, fault hooks and invariants as one part. It
reads the parts the engine was built with (stats, memory, integrity) and never holds the engine."""

from __future__ import annotations

from kvstore.pool.kv_cache import KVCache
from workers.engine.block_manager import cdiv
from workers.engine.config import EngineConfig
from workers.engine.sampling.postprocess import Postprocessor
from workers.engine.scheduling.scheduler import Scheduler, SchedulerOutput
from workers.engine.stats.counters import StepCounters
from workers.engine.stats.faults import StepFaults
from workers.engine.stats.snapshot import EngineStats, MemoryBreakdown


class EngineReport:
    def __init__(
        self,
        config: EngineConfig,
        model_id: str,
        weights_bytes: int,
        kv_cache: KVCache,
        scheduler: Scheduler,
        post: Postprocessor,
        dtype: str = "float32",  # the weights' and GEMMs' (model/precision.py); the pool's: its layout's
    ) -> None:
        self.model_id = model_id
        self.weights_bytes = weights_bytes  # counted once, after the runner packed the linears
        self.kv_cache = kv_cache
        self.scheduler = scheduler
        self.post = post
        self.dtype = dtype
        self.counters = StepCounters()
        self.faults = StepFaults(config)

    def on_scheduled(self, step: SchedulerOutput) -> None:
        """Right after scheduling: the fault hooks (tests) may sleep or raise here."""
        self.faults.on_step(step.scheduled)

    def memory(self) -> MemoryBreakdown:
        stats = self.scheduler.blocks.pool.stats()
        per = self.kv_cache.layout.bytes_per_block
        return MemoryBreakdown(
            weights_bytes=self.weights_bytes,
            pool_bytes=self.kv_cache.nbytes,
            used_bytes=stats.blocks_used * per,
            cached_bytes=stats.blocks_cached * per,
            free_bytes=stats.blocks_free * per,
        )

    def stats(self) -> EngineStats:
        counters, scheduler = self.counters, self.scheduler
        return EngineStats(
            model_id=self.model_id,
            bytes_per_block=self.kv_cache.layout.bytes_per_block,
            pool=scheduler.blocks.pool.stats(),
            memory=self.memory(),
            num_steps=counters.num_steps,
            num_preemptions=scheduler.num_preemptions,
            num_running=len(scheduler.running),
            num_waiting=len(scheduler.waiting),
            max_batch_seqs=counters.max_batch_seqs,
            max_batch_tokens=counters.max_batch_tokens,
            prompt_tokens_computed=counters.prompt_tokens_computed,
            generation_tokens=self.post.generation_tokens,
            seconds_decode_only=scheduler.cost.seconds_decode_only,
            seconds_with_prefill=scheduler.cost.seconds_with_prefill,
            num_held_steps=scheduler.num_held_steps,
            prefill_tokens_pending=sum(
                max(0, s.num_prompt_tokens - s.num_computed_tokens) for s in scheduler.running
            ),
            blocks_kept=len(scheduler.blocks.tails),
            oldest_waiting_s=scheduler.hold.oldest_wait(scheduler.clock()),
            dtype=self.dtype,
            kv_cache_dtype=str(self.kv_cache.layout.dtype).removeprefix("torch."),
        )

    def check_integrity(self, idle: bool) -> None:
        """Pool invariants, plus: every running sequence's blocks are referenced and sized right;
        once `idle` (no request unfinished), only kept session tails hold blocks."""
        scheduler = self.scheduler
        pool = scheduler.blocks.pool
        pool.check_integrity()
        for seq in scheduler.running:
            assert len(seq.block_ids) >= cdiv(seq.num_computed_tokens, pool.block_size), seq.request_id
            assert all(pool.blocks[b].ref_cnt > 0 for b in seq.block_ids), seq.request_id
        for seq in scheduler.waiting:
            assert not seq.block_ids, seq.request_id
        if idle:
            kept = len(scheduler.blocks.tails)  # partial blocks of finished session turns
            assert pool.stats().blocks_used == kept, "blocks leaked after all requests finished"
