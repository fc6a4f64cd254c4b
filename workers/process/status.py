"""A worker's status for its heartbeat, built without waiting on anything: the engine loop's
latest published snapshot (a plain attribute) and the service's immutable job counts."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from broker.messages import EngineFigures, WorkerStatus
from workers.engine.stats.snapshot import EngineStats
from workers.jobs.engine_service import EngineService
from workers.jobs.maintenance import Maintenance, MaintenanceFigures

if TYPE_CHECKING:
    from workers.loop.protocol import Loop


def figures_of(stats: EngineStats) -> EngineFigures:
    pool = stats.pool
    return EngineFigures(
        num_running=stats.num_running,
        num_waiting=stats.num_waiting,
        num_steps=stats.num_steps,
        max_batch_seqs=stats.max_batch_seqs,
        generation_tokens=stats.generation_tokens,
        pool_blocks_total=pool.blocks_total,
        pool_blocks_used=pool.blocks_used,
        pool_blocks_cached=pool.blocks_cached,
        bytes_per_block=stats.bytes_per_block,
        prefix_cache_queries_tokens=pool.prefix_cache_queries_tokens,
        prefix_cache_hits_tokens=pool.prefix_cache_hits_tokens,
        fragmentation=pool.fragmentation,
        weights_bytes=stats.memory.weights_bytes,
        pool_bytes=stats.memory.pool_bytes,
        seconds_decode_only=stats.seconds_decode_only,
        seconds_with_prefill=stats.seconds_with_prefill,
        num_held_steps=stats.num_held_steps,
        prefill_tokens_pending=stats.prefill_tokens_pending,
        num_preemptions=stats.num_preemptions,
        pool_blocks_kept=stats.blocks_kept,
        oldest_waiting_s=stats.oldest_waiting_s,
        dtype=stats.dtype,
        kv_cache_dtype=stats.kv_cache_dtype,
    )


def loop_healthy(loop: Loop | None) -> bool:
    return loop.healthy if loop is not None else True


class StatusReader:
    """Builds the heartbeat's WorkerStatus. Never blocks: no engine lock, no Redis, no call into
    the loop thread (it reads the snapshot the loop publishes after each step, `latest_stats`)."""

    def __init__(
        self,
        service: EngineService,
        maintenance: Maintenance | None = None,
        concurrency: int = 0,
        seats: int = 0,
    ) -> None:
        self.service = service
        self._maintenance = maintenance
        self.concurrency = concurrency  # the api's dispatch windows count its threads and seats
        self.seats = seats  # (api/jobs/admission.py)

    @staticmethod
    def _stats(loop: Loop | None) -> EngineStats | None:
        return loop.latest_stats if loop is not None else None

    def read(self) -> WorkerStatus:
        service = self.service
        loop = service.current_loop
        stats = self._stats(loop)
        counts = service.counts
        return WorkerStatus(
            name=service.identity.name,
            queue=service.identity.queue,
            model=service.served_model,
            jobs_running=counts.running,
            jobs_done=counts.done,
            jobs_failed=counts.failed,
            sent_at=time.time(),
            engine=figures_of(stats) if stats is not None else None,
            healthy=loop_healthy(loop),
            concurrency=self.concurrency,
            seats=self.seats,
            warm_start_blocks=service.warm_started.blocks,
            warm_start_bytes=service.warm_started.bytes,
        )

    def maintenance(self) -> MaintenanceFigures:
        """The maintenance thread's figures (a snapshot), published beside the status."""
        return self._maintenance.figures if self._maintenance is not None else MaintenanceFigures()
