"""WarmTier: a host-memory LRU of blocks that left the device pool, keyed by block hash.

Thread-safe (one lock): the engine thread spills into it while task threads prefetch into it. It
does not verify token ids: the hash is chained, and the engine checks tokens on every hit.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from kvstore.chain import BlockHash
from kvstore.tiers.stats import WarmTierStats
from kvstore.tiers.stored_block import StoredBlock


class WarmTier:
    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self._blocks: OrderedDict[BlockHash, StoredBlock] = OrderedDict()  # least recently used first
        self._nbytes = 0
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self._lock = threading.Lock()

    def put(self, block: StoredBlock) -> None:
        """Insert or refresh ``block``, evicting least recently used blocks to stay within capacity.

        A block larger than the whole capacity is not stored (and evicts nothing).
        """
        size = len(block.kv)
        with self._lock:
            old = self._blocks.pop(block.block_hash, None)
            if old is not None:
                self._nbytes -= len(old.kv)
            if size > self.capacity_bytes:
                return
            self._blocks[block.block_hash] = block
            self._nbytes += size
            while self._nbytes > self.capacity_bytes:  # stops before the new block: size <= capacity
                _, evicted = self._blocks.popitem(last=False)
                self._nbytes -= len(evicted.kv)
                self._evictions += 1

    def get(self, block_hash: BlockHash) -> StoredBlock | None:
        with self._lock:
            block = self._blocks.get(block_hash)
            if block is None:
                self._misses += 1
                return None
            self._blocks.move_to_end(block_hash)
            self._hits += 1
            return block

    def peek(self, block_hash: BlockHash) -> StoredBlock | None:
        """The block without refreshing it or counting a hit or miss."""
        with self._lock:
            return self._blocks.get(block_hash)

    def peek_run(self, hashes: Sequence[BlockHash]) -> list[StoredBlock]:
        """The blocks of hashes[0], hashes[1], ... up to the first one not held; changes nothing."""
        with self._lock:
            return self._run(hashes)

    def _run(self, hashes: Sequence[BlockHash]) -> list[StoredBlock]:
        run: list[StoredBlock] = []
        for block_hash in hashes:
            block = self._blocks.get(block_hash)
            if block is None:
                break
            run.append(block)
        return run

    def get_run(self, hashes: Sequence[BlockHash]) -> list[StoredBlock]:
        """The blocks of hashes[0], hashes[1], ... up to the first one not held; refreshes them.

        The run is refreshed last block first, so a sequence's prefix stays the most recently used.
        """
        with self._lock:
            run = self._run(hashes)
            for block in reversed(run):
                self._blocks.move_to_end(block.block_hash)
            self._hits += len(run)
            self._misses += len(hashes) - len(run)
            return run

    def pop(self, block_hash: BlockHash) -> StoredBlock | None:
        with self._lock:
            block = self._blocks.pop(block_hash, None)
            if block is not None:
                self._nbytes -= len(block.kv)
            return block

    def __contains__(self, block_hash: object) -> bool:
        with self._lock:
            return block_hash in self._blocks

    def __len__(self) -> int:
        with self._lock:
            return len(self._blocks)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._nbytes

    def stats(self) -> WarmTierStats:
        with self._lock:
            return WarmTierStats(
                blocks=len(self._blocks),
                bytes=self._nbytes,
                capacity_bytes=self.capacity_bytes,
                hits=self._hits,
                misses=self._misses,
                evictions=self._evictions,
            )
