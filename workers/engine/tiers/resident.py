"""ResidentBlocks: which block hashes this worker holds (in its pool's index or its warm tier), as a
view any thread may read. The engine thread keeps it from the pool's events; the warm tier is
thread-safe itself. A task thread asks it before fetching from Redis, and never reads the pool.

A stale answer costs a redundant fetch or a recompute, never a wrong token: the engine verifies
the tokens of every hit when it admits the request."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from kvstore.chain import BlockHash
from kvstore.pool.events import AllBlocksCleared, BlockEvent, BlockRemoved, BlockStored
from kvstore.tiers.warm import WarmTier
from workers.engine.tiers.in_flight import InFlight

MAX_EXPECTED = 100_000


class ResidentBlocks:
    def __init__(self, warm: WarmTier) -> None:
        self._warm = warm
        self._pool: set[BlockHash] = set()  # hashes the pool's index holds now
        # Fetched from Redis and on their way to the warm tier (a WarmBlocks message the engine
        # thread has not taken yet): resident already, or a second prefetch would fetch them again.
        self._expected: set[BlockHash] = set()
        # Parents under which this worker keeps a session turn's partial last block (KeptTails
        # tells), or one is on its way from Redis: a prefetch then fetches no tail.
        self._tails: set[BlockHash] = set()
        self._lock = threading.Lock()
        self.reading = InFlight()  # blocks a prefetch is reading from Redis now (not expected yet)

    def expect(self, hashes: Sequence[BlockHash]) -> None:
        """On the fetching thread: these blocks are on their way (EngineLoop.warm)."""
        with self._lock:
            if len(self._expected) > MAX_EXPECTED:  # messages of a loop that stopped: never arrive
                self._expected.clear()
            self._expected.update(hashes)

    def arrived(self, hashes: Sequence[BlockHash]) -> None:
        """On the engine thread: these blocks are in the warm tier now (or were refused)."""
        with self._lock:
            self._expected.difference_update(hashes)

    def on_tail(self, parent: BlockHash, held: bool) -> None:
        """On the engine thread: a tail under `parent` is kept now (held), or no longer."""
        with self._lock:
            if held:
                self._tails.add(parent)
            else:
                self._tails.discard(parent)

    def expect_tail(self, parent: BlockHash) -> None:
        """On the fetching thread: a tail under `parent` is on its way (EngineLoop.warm_tail)."""
        with self._lock:
            if len(self._tails) > MAX_EXPECTED:
                self._tails.clear()
            self._tails.add(parent)

    def has_tail(self, parent: BlockHash) -> bool:
        with self._lock:
            return parent in self._tails

    def on_pool_event(self, event: BlockEvent) -> None:
        """On the engine thread: the pool indexed, dropped or cleared blocks."""
        with self._lock:
            if isinstance(event, BlockStored):
                self._pool.add(event.block_hash)
            elif isinstance(event, BlockRemoved):
                self._pool.discard(event.block_hash)
            elif isinstance(event, AllBlocksCleared):
                self._pool.clear()

    def __contains__(self, block_hash: object) -> bool:
        with self._lock:
            if block_hash in self._pool or block_hash in self._expected:
                return True
        return block_hash in self._warm

    def first_missing(self, hashes: Sequence[BlockHash]) -> int:
        """The index of the first of `hashes` resident neither in the pool nor warm (len when all are)."""
        for i, block_hash in enumerate(hashes):
            if block_hash not in self:
                return i
        return len(hashes)
