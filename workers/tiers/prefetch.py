"""Prefetch: pull a prompt's blocks from the Redis tier into the warm tier before the job reaches
the engine, on the submitting thread, so the engine thread never waits on Redis; and, ahead of
the job, on a hint from the router (HintListener).

The submitting thread never reads the engine: it hashes the prompt (kvstore.chain), asks the
loop's `resident` view which blocks this worker already holds, fetches the rest from Redis and hands
them to the engine thread as a message (EngineLoop.warm), which lands before the job's Submit."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import redis

from broker import keys
from broker.routing import prefetch_hint
from broker.sessions import store as session_store
from kvstore.chain import BlockHash, chain
from kvstore.redis.tails import get_tail

if TYPE_CHECKING:  # torch's: a worker in the simulated mode never loads them
    from kvstore.redis.tier import RedisTier
    from kvstore.tiers.stored_block import StoredBlock
    from kvstore.tiers.tail import Tail
    from workers.engine.tiers.resident import ResidentBlocks

from workers.background import BackgroundThread

log = logging.getLogger(__name__)


class PrefetchTarget(Protocol):
    """Where prefetched blocks go: workers/loop/engine_loop.EngineLoop (or, in the benchmarks,
    which drive an engine on one thread, ops/bench/engine_target.EngineTarget)."""

    block_size: int
    fingerprint: str

    @property
    def resident(self) -> ResidentBlocks | None: ...

    def warm(
        self, blocks: list[StoredBlock], at_request: bool = True, tails: tuple[Tail, ...] = ()
    ) -> None: ...


def prefetch(
    target: PrefetchTarget,
    tier: RedisTier,
    ids: list[int],
    tenant: str,
    tails: bool = False,
    cause: str = "job",
) -> int:
    """Fetch the blocks of `ids` that this worker holds neither in its pool nor warm; returns how
    many came from Redis. `tails` (a session's turn): also the partial last block of the turn that
    ended where the blocks this worker will hold end, unless it keeps one there (a turn moved
    here: its previous turn ran elsewhere and wrote it through, kvstore/tiers/tail.py). `cause`: the
    read's, for the tier's counters ("job", or "hint": HintListener's). While another prefetch here
    reads the first block missing (a hint ahead of this turn), it waits for that read to land, then
    reads only what is still missing (workers/engine/tiers/in_flight.py)."""
    resident = target.resident
    if resident is None:
        return 0
    bs = target.block_size
    n_blocks = (len(ids) - 1) // bs  # the last prompt token is always computed
    hashes = chain(ids[: n_blocks * bs], bs, target.fingerprint, tenant)
    first = resident.first_missing(hashes)
    if first == n_blocks:
        return _fetch(target, tier, ids, hashes, first, tails, cause)
    with resident.reading.claim(hashes[first:]):  # a concurrent fetch of them lands first
        return _fetch(target, tier, ids, hashes, resident.first_missing(hashes), tails, cause)


def _fetch(
    target: PrefetchTarget,
    tier: RedisTier,
    ids: list[int],
    hashes: list[BlockHash],
    first: int,
    tails: bool,
    cause: str,
) -> int:
    """prefetch's read from `first`, the first block this worker does not hold."""
    resident, bs, n_blocks = target.resident, target.block_size, len(hashes)
    assert resident is not None
    run = []
    if first < n_blocks:
        run = tier.get_run(
            hashes[first:], [ids[i * bs : (i + 1) * bs] for i in range(first, n_blocks)], cause
        )
    held = first + len(run)  # the blocks this worker holds once the run lands
    tail = None
    if tails and held and not resident.has_tail(hashes[held - 1]):
        tail = get_tail(tier, hashes[held - 1], ids[held * bs : len(ids) - 1])
    if run or tail is not None:
        target.warm(run, tails=(tail,) if tail is not None else ())
    return len(run)


class HintListener:
    """Drains this worker's prefetch list (api/routing/router.py pushes a hint when it sends a session's
    turn here that its last worker would have served): each hint loads the session's blocks from
    Redis into the warm tier, on this thread, while the turn waits in the queue. The job's own
    prefetch then finds them warm, and the partial last block of the session's last turn kept. `fetch(ids,
    salt, tails, cause)` is the worker's prefetch; it never builds the engine: until `ready()`, hints are
    dropped unread."""

    def __init__(
        self,
        client: redis.Redis,
        worker: str,
        fetch: Callable[[list[int], str, bool, str], int],
        ready: Callable[[], bool],
        block_s: float = 1.0,
    ) -> None:
        self.redis = client
        self.fetch = fetch
        self.ready = ready  # whether the engine (and its tier) is built: before, hints are dropped
        self.block_s = block_s
        self.key = keys.worker_prefetch(worker)
        self.loaded_blocks = self.hints = 0
        self._confined = False
        self._thread = BackgroundThread("kvferry-prefetch-hints", self._run)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop(join_s=None)  # a blocked BLPOP ends within block_s

    def _run(self) -> None:
        while not self._thread.stopped:
            try:
                got: Any = self.redis.blpop([self.key], timeout=self.block_s)
                if got is not None:
                    self.handle(got[1])
            except redis.RedisError as exc:  # Redis away: hints wait (or expire); jobs fetch alone
                log.debug("prefetch hints: %s", exc)
                self._thread.wait(self.block_s)
            except Exception:  # a hint must never take the thread down
                log.exception("prefetch hint failed")

    def handle(self, raw: bytes) -> int:
        """Load one hint's blocks; returns how many came from Redis."""
        hint = prefetch_hint.decode(raw)
        if hint is None or not self.ready():
            return 0
        if not self._confined:  # the engine is built (torch loaded): only now, never in the simulated mode
            from workers.engine.kernels.omp_team import confine_to_this_thread

            confine_to_this_thread()  # decoding lossy tier blocks runs torch ops: no second OpenMP pool
            self._confined = True
        self.hints += 1
        stored = session_store.load_tokens(self.redis, hint.tenant, hint.session_id)
        if stored is not None:
            ids = list(stored.token_ids)
        else:
            record = session_store.load(self.redis, hint.tenant, hint.session_id)
            ids = list(record.token_ids) if record is not None else []
        if not ids:
            return 0
        # +1: the next turn adds tokens, so every block of these ids is a full prompt block then.
        n = self.fetch([*ids, 0], hint.kv_salt, True, "hint")  # with the turn's tail: it moves here
        self.loaded_blocks += n
        return n
