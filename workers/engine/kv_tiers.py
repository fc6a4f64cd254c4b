"""TierCache: the engine's side of the warm (host memory) and cold (Redis) tiers.

Blocks leave the hot pool only when their slot is reused (lazy LRU eviction): the pool announces
BlockRemoved before the slot is overwritten, and the block's bytes go to the warm tier then. A
finished turn's blocks are handed to the cold-tier sink (a writer thread: Redis I/O never runs on
the engine thread). Admission asks the warm tier for the blocks right after the pool's hits;
Redis reads happen earlier, on the submitting thread (prefetch into the warm tier).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvstore.block_events import AllBlocksCleared, BlockEvent, BlockRemoved, BlockStored
from kvstore.block_hash import BlockHash
from kvstore.block_pool import BlockPool
from kvstore.kv_cache import KVCache
from kvstore.stored_block import KVFormat, StoredBlock
from kvstore.warm_tier import WarmTier

ColdSink = Callable[[list[StoredBlock]], None]
# Bounds for the sets of hashes remembered across turns: forgetting one costs a redundant write
# (the Redis tier skips blocks it already indexes) or a "warm" instead of "redis" label, nothing more.
MAX_REMEMBERED_HASHES = 200_000


class TierCache:
    def __init__(self, pool: BlockPool, kv_cache: KVCache, fmt: KVFormat, warm: WarmTier) -> None:
        self.pool = pool
        self.kv_cache = kv_cache
        self.fmt = fmt
        self.warm = warm
        self.cold_sink: ColdSink | None = None
        self._meta: dict[BlockHash, tuple[BlockHash, tuple[int, ...]]] = {}  # indexed: parent, tokens
        self._persisted: set[BlockHash] = set()  # handed to the cold sink (or read from it)
        self.from_redis: set[BlockHash] = set()  # warm blocks that a prefetch brought from Redis
        self.spilled_blocks = 0
        pool.subscribe(self._on_event)

    def _on_event(self, event: BlockEvent) -> None:
        if isinstance(event, BlockStored):
            self._meta[event.block_hash] = (event.parent_hash, event.token_ids)
        elif isinstance(event, BlockRemoved):
            meta = self._meta.pop(event.block_hash, None)
            if meta is None:
                return
            block = StoredBlock(event.block_hash, meta[0], meta[1], self.kv_cache.read_block(event.block_id))
            self.warm.put(block)
            self.spilled_blocks += 1
            self._to_cold([block])
        elif isinstance(event, AllBlocksCleared):
            self._meta.clear()

    def _to_cold(self, blocks: list[StoredBlock]) -> None:
        fresh = [b for b in blocks if b.block_hash not in self._persisted]
        if len(self._persisted) > MAX_REMEMBERED_HASHES:
            self._persisted.clear()
        if len(self.from_redis) > MAX_REMEMBERED_HASHES:
            self.from_redis.clear()
        if fresh and self.cold_sink is not None:
            self._persisted.update(b.block_hash for b in fresh)
            self.cold_sink(fresh)

    def mark_persisted(self, hashes: Sequence[BlockHash]) -> None:
        self._persisted.update(hashes)

    def lookup(
        self, hashes: Sequence[BlockHash], token_ids: Sequence[int], first_block: int
    ) -> list[StoredBlock]:
        """The warm tier's run of blocks for hashes[0], hashes[1], ...: block i covers tokens
        [(first_block + i) * bs, ...). A block whose tokens differ ends the run."""
        bs = self.pool.block_size
        run = []
        for i, block in enumerate(self.warm.get_run(hashes)):
            start = (first_block + i) * bs
            if tuple(token_ids[start : start + bs]) != block.token_ids:
                break
            run.append(block)
        return run

    def persist(
        self, block_ids: Sequence[int], hashes: Sequence[BlockHash], token_ids: Sequence[int], root: BlockHash
    ) -> None:
        """A finished turn: its full blocks go to the cold tier (write-through) unless already there."""
        if self.cold_sink is None:
            return
        bs = self.pool.block_size
        blocks = []
        for i, (block_id, block_hash) in enumerate(zip(block_ids, hashes, strict=False)):
            if block_hash in self._persisted:
                continue
            parent = hashes[i - 1] if i else root
            blocks.append(
                StoredBlock(
                    block_hash,
                    parent,
                    tuple(token_ids[i * bs : (i + 1) * bs]),
                    self.kv_cache.read_block(block_id),
                )
            )
        self._to_cold(blocks)
