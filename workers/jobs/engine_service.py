"""EngineService: one per worker process. Builds the engine and its loop lazily on the first job
(never at import time), owns the Redis tier and its writer, and keeps the job counters.

In the simulated mode (asked for by name: workers/loop/simulated.py) the loop is a SimulatedLoop
instead, and nothing here imports torch: the engine, its loop and the tier are imported where
they are built.

Running a job is workers/jobs/runner.py; sessions and digests are workers/sessions/keeper.py; the
heartbeat's figures are workers/process/status.py."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from broker import keys
from broker.redis import client as redis_client
from kvstore.redis.client import KV_ERRORS, KVClient, kv_client
from workers.engine.config import EngineConfig
from workers.engine.errors import EngineFailedError
from workers.loop.protocol import Loop
from workers.loop.simulated import SimulatedEngine, SimulatedLoop
from workers.sessions.keeper import SessionKeeper
from workers.tiers.config import TierConfig
from workers.tiers.warm_start import WarmStartFigures

if TYPE_CHECKING:  # torch's: imported where they are built, never in the simulated mode
    import torch

    from kvstore.layout import KVFormat
    from kvstore.redis.tier import RedisTier
    from workers.engine.llm_engine import LLMEngine
    from workers.jobs.interactive_presence import InteractivePresence
    from workers.loop.engine_loop import EngineLoop
    from workers.tiers.writer import KVWriter

log = logging.getLogger(__name__)
AFTER_WRITE_FLUSH_S = 30.0  # a stop waits this long at most for the last turns' records and pins


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    name: str  # the Celery node name, e.g. "w1@host"

    @property
    def queue(self) -> str:
        return keys.worker_queue(self.name)


@dataclass(frozen=True, slots=True)
class JobCounts:
    running: int
    done: int
    failed: int


class EngineService:
    def __init__(
        self,
        config: EngineConfig,
        cache_dir: Path,
        redis_url: str,
        identity: WorkerIdentity,
        tiers: TierConfig | None = None,
        kv_redis_url: str | None = None,
        simulated: SimulatedEngine | None = None,
    ) -> None:
        self.config = config
        self.simulated = simulated
        self.tier_config = tiers or TierConfig()
        self.redis_tier: RedisTier | None = None
        self.writer: KVWriter | None = None
        self.cache_dir = cache_dir
        self.identity = identity
        self.served_model = config.served_model_name or config.model
        self.redis = redis_client.connect(redis_url)
        # The KV tier may live in a Redis of its own (block packs are big; the queue must stay fast).
        # redis+cluster://: a Redis Cluster (kvstore/redis/client.py)
        self.kv_redis: KVClient = kv_client(kv_redis_url) if kv_redis_url else self.redis
        self._lock = threading.Lock()  # held through the model load: never taken by the heartbeat
        self._counts_lock = threading.Lock()
        self._loop: Loop | None = None
        self.presence: InteractivePresence | None = None  # with an engine loop (not simulated)
        self._handed_back = False  # a drain past its timeout stopped the engine: never rebuilt
        self.load_error: Exception | None = None  # the last failed engine build, if any
        self._counts = JobCounts(0, 0, 0)
        self.warm_started = WarmStartFigures()  # what warm_start() loaded
        self.sessions = SessionKeeper(
            self.redis, self.kv_redis, identity.name, self.served_model, self.tier_config
        )

    @property
    def current_loop(self) -> Loop | None:
        """The loop if it is built, without waiting for a model load in progress."""
        return self._loop

    def loop(self) -> Loop:
        """The engine loop, built on first use. A build that fails is the worker's failure, not
        the job's: EngineFailedError (the job is redelivered), and the supervisor sees load_error."""
        with self._lock:
            if self._handed_back:
                raise EngineFailedError("the worker is draining: the job is handed back")
            if self._loop is None and self.simulated is not None:
                self._loop = SimulatedLoop(self.simulated.token_delay_s, self.simulated.default_max_tokens)
            if self._loop is None:
                from workers.loop.engine_loop import EngineLoop

                try:
                    self._loop = loop = EngineLoop.build(self._build_engine)
                except Exception as exc:
                    self.load_error = exc
                    raise EngineFailedError(f"the engine could not be built: {exc}") from exc
                if self.writer is not None:
                    self.writer.yielding.idle = loop.idle
                self._start_presence(loop)
            return self._loop

    def _start_presence(self, loop: EngineLoop) -> None:
        from workers.engine.scheduling.batch_budget import INTERACTIVE_LINGER_S
        from workers.jobs.interactive_presence import InteractivePresence

        self.presence = InteractivePresence(self.redis, INTERACTIVE_LINGER_S, loop.interactive_flows_until)
        self.presence.start()

    def interactive_started(self) -> InteractivePresence | None:
        """An interactive job starts here: the fleet's batch steps are sized until it ends (call
        the presence's end()) and a linger after."""
        presence = self.presence
        if presence is not None:
            presence.begin()
        return presence

    def _build_engine(self) -> LLMEngine:
        """On the loop's own thread: the engine, with the Redis tier's writer attached."""
        from workers.engine.factory import build_engine

        return build_engine(self.config, cache_dir=self.cache_dir, cold_writer=self._cold_writer)

    def _cold_writer(self, fmt: KVFormat, device: torch.device) -> KVWriter | None:
        """Asked by build_engine when blocks leaving the pool spill: the Redis tier's writer."""
        from kvstore.redis.tier import RedisTier
        from workers.tiers.writer import KVWriter

        if self.tier_config.redis_capacity_bytes <= 0:
            return None
        self.redis_tier = RedisTier(
            self.kv_redis,
            fmt,
            self.tier_config.redis_capacity_bytes,
            tenant_quota_bytes=self.tier_config.tenant_kv_quota_bytes,
            # an int8 pool's blocks are already the small form: stored exact (kvstore/tiers/quant.py)
            tier_dtype=self.tier_config.tier_dtype if fmt.dtype != "int8" else "exact",
        )
        self.writer = KVWriter(
            self.redis_tier,
            max_queued_bytes=self.tier_config.kv_write_queue_bytes,
            pinned_memory=device.type == "cuda",
            defer_s=self.tier_config.kv_write_defer_s,
        )
        self.sessions.attach(self.redis_tier, self.writer)
        return self.writer

    def stop_engine(self) -> None:
        """A drain past its timeout: stop the loop (its requests fail with EngineFailedError, so
        their tasks hand the messages back) and never build another; the writer keeps writing."""
        with self._lock:
            self._handed_back = True
            if self.presence is not None:
                self.presence.stop()
                self.presence = None
            if self._loop is not None:
                self._loop.stop()
                self._loop = None

    def shutdown(self) -> None:
        with self._lock:
            if self.presence is not None:
                self.presence.stop()
                self.presence = None
            if self._loop is not None:
                self._loop.stop()
                self._loop = None
            if self.writer is not None:
                self.writer.stop()  # written through: each turn's after-write work is queued
                self.writer = None
            if not self.sessions.after_writes.flush(AFTER_WRITE_FLUSH_S):
                log.warning("stopping with session bookkeeping still queued after %.0fs", AFTER_WRITE_FLUSH_S)
            self.sessions.detach()

    def count(self, running: int = 0, done: int = 0, failed: int = 0) -> None:
        with self._counts_lock:
            c = self._counts
            self._counts = JobCounts(c.running + running, c.done + done, c.failed + failed)

    @property
    def counts(self) -> JobCounts:
        return self._counts  # an immutable snapshot: read without a lock

    def can_prefetch(self) -> bool:
        """Whether the engine and its Redis tier are built (prefetches before that are dropped)."""
        return self._loop is not None and self.redis_tier is not None

    def warm_start(self) -> WarmStartFigures:
        """Before the worker takes work, with the engine built: the hottest prefixes from the Redis
        tier into the warm tier (workers/tiers/warm_start.py), up to tier_config.warm_start_bytes."""
        loop, tier = self._loop, self.redis_tier
        if loop is None or tier is None or self.tier_config.warm_start_bytes <= 0:
            return self.warm_started
        from workers.engine.kernels.omp_team import confine_to_this_thread
        from workers.tiers.warm_start import warm_start

        confine_to_this_thread()
        try:
            self.warm_started = warm_start(
                self.redis, loop, tier, self.served_model, self.tier_config.warm_start_bytes
            )
        except KV_ERRORS as exc:  # a cold start (queue or KV Redis away), never a failed one
            log.warning("warm start from the Redis tier failed: %s", exc)
        return self.warm_started

    def prefetch(self, ids: list[int], salt: str, tails: bool = False, cause: str = "job") -> int:
        """On a job's (or the hint listener's) thread: a prompt's blocks from Redis into the warm
        tier; how many came. Never builds the engine: 0 before it is built."""
        loop, tier = self._loop, self.redis_tier
        if loop is None or tier is None:
            return 0
        from workers.engine.kernels.omp_team import confine_to_this_thread
        from workers.tiers.prefetch import prefetch

        confine_to_this_thread()  # decoding lossy tier blocks runs torch ops: no second OpenMP pool
        try:
            return prefetch(loop, tier, ids, salt, tails, cause)
        except KV_ERRORS as exc:  # the tier only ever misses: the engine computes it
            log.warning("prefetch from the Redis tier failed: %s", exc)
            return 0
