"""Prefetch: pull a prompt's blocks from the Redis tier into the warm tier before the job reaches
the engine, on the submitting thread, so the engine thread never waits on Redis; and, ahead of
the job, on a hint from the router (HintListener)."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

import redis

from broker import keys, prefetch_hint
from broker.sessions import store as session_store
from kvstore.chain import hash_blocks, root_hash
from kvstore.redis.tier import RedisTier
from workers.engine.kernels.omp_team import confine_to_this_thread
from workers.engine.llm_engine import LLMEngine

if TYPE_CHECKING:
    from workers.process.engine_service import EngineService

log = logging.getLogger(__name__)


def prefetch(engine: LLMEngine, tier: RedisTier, ids: list[int], tenant: str) -> int:
    """Fetch the blocks of `ids` that neither the pool nor the warm tier holds; returns how many."""
    tiers = engine.tiers
    if tiers is None:
        return 0
    bs = engine.pool.block_size
    n_blocks = (len(ids) - 1) // bs  # the last prompt token is always computed
    if n_blocks == 0:
        return 0
    hashes = hash_blocks(ids[: n_blocks * bs], bs, (), parent=root_hash((engine.loaded.fingerprint, tenant)))
    first = 0  # reads of engine-owned indexes: a stale answer costs a fetch or a recompute, never a token
    while first < n_blocks and (
        hashes[first] in tiers.warm
        or engine.pool.get_cached_block(hashes[first], ids[first * bs : (first + 1) * bs]) is not None
    ):
        first += 1
    if first == n_blocks:
        return 0
    run = tier.get_run(hashes[first:], [ids[i * bs : (i + 1) * bs] for i in range(first, n_blocks)])
    for block in run:
        tiers.warm.put(block)
    tiers.from_redis.update(b.block_hash for b in run)
    tiers.mark_persisted([b.block_hash for b in run])
    return len(run)


class HintListener:
    """Drains this worker's prefetch list (api/router.py pushes a hint when it sends a session's
    turn here that its last worker would have served): each hint loads the session's blocks from
    Redis into the warm tier, on this thread, while the turn waits in the queue. The job's own
    prefetch then finds them warm. Never builds the engine: before it is built, hints are dropped."""

    def __init__(self, service: EngineService, block_s: float = 1.0) -> None:
        self.service = service
        self.block_s = block_s
        self.key = keys.worker_prefetch(service.identity.name)
        self.loaded_blocks = self.hints = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvferry-prefetch-hints", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        confine_to_this_thread()  # decoding lossy tier blocks runs torch ops: no second OpenMP pool
        while not self._stop.is_set():
            try:
                got: Any = self.service.redis.blpop([self.key], timeout=self.block_s)
                if got is not None:
                    self.handle(got[1])
            except redis.RedisError as exc:  # Redis away: hints wait (or expire); jobs fetch alone
                log.debug("prefetch hints: %s", exc)
                self._stop.wait(self.block_s)
            except Exception:  # a hint must never take the thread down
                log.exception("prefetch hint failed")

    def handle(self, raw: bytes) -> int:
        """Load one hint's blocks; returns how many came from Redis."""
        hint = prefetch_hint.decode(raw)
        loop = self.service.current_loop
        tier = self.service.redis_tier
        if hint is None or loop is None or tier is None:
            return 0
        self.hints += 1
        stored = session_store.load_tokens(self.service.redis, hint.tenant, hint.session_id)
        if stored is not None:
            ids = list(stored.token_ids)
        else:
            record = session_store.load(self.service.redis, hint.tenant, hint.session_id)
            ids = list(record.token_ids) if record is not None else []
        if not ids:
            return 0
        # +1: the next turn adds tokens, so every block of these ids is a full prompt block then.
        n = prefetch(loop.engine, tier, [*ids, 0], hint.kv_salt)
        self.loaded_blocks += n
        return n
