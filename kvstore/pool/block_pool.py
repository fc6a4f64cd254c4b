"""Block bookkeeping for the KV pool: refcounts, free queue (LRU), prefix-hash index, events.

Pure bookkeeping: it never touches tensors. Block ``i`` here is slot ``i`` of the pool tensor.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from kvstore.chain import BlockHash
from kvstore.errors import PoolIntegrityError
from kvstore.pool.block import Block
from kvstore.pool.events import AllBlocksCleared, BlockEvent, BlockRemoved, BlockStored
from kvstore.pool.free_queue import FreeBlockQueue
from kvstore.pool.stats import PoolStats


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.blocks = [Block(block_id=i) for i in range(num_blocks)]
        self._free = FreeBlockQueue(self.blocks)
        self._index: dict[BlockHash, Block] = {}
        self._num_used = 0
        self._peak_used = 0
        self._query_tokens = 0
        self._hit_tokens = 0
        self._subscribers: list[Callable[[BlockEvent], None]] = []

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref_cnt == 0, cached or not: all of them can be allocated."""
        return len(self._free)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[Block] | None:
        """Take ``n`` blocks from the LRU end of the free queue, evicting any cached ones.

        Returns None, changing nothing, when fewer than ``n`` blocks are free.
        """
        if n < 0:
            raise ValueError(f"cannot allocate {n} blocks")
        if n > len(self._free):
            return None
        events: list[BlockEvent] = []
        taken: list[Block] = []
        for _ in range(n):
            block = self._free.popleft()
            if block.block_hash is not None:
                # A duplicate-hash block was never indexed, so it was never announced either.
                if self._index.get(block.block_hash) is block:
                    del self._index[block.block_hash]
                    events.append(BlockRemoved(block.block_hash, block.block_id))
                block.reset_hash()
            block.token_ids = ()
            block.ref_cnt = 1
            block.num_tokens = 0
            taken.append(block)
        self._num_used += n
        self._peak_used = max(self._peak_used, self._num_used)
        # Emitted before the caller writes into the slots, so a subscriber may still spill them.
        self._emit(events)
        return taken

    def touch(self, blocks: Sequence[Block]) -> None:
        """Take one more reference on each block (prefix-cache hits), reviving free ones."""
        self._check_owned(blocks)
        for block in blocks:
            if block.ref_cnt == 0:
                self._free.remove(block)
                self._num_used += 1
            block.ref_cnt += 1
        self._peak_used = max(self._peak_used, self._num_used)

    def free(self, blocks: Sequence[Block]) -> None:
        """Drop one reference on each block; ``blocks`` in sequence order, prefix first.

        Walking in reverse and appending hashed blocks at the tail leaves a sequence's last block
        nearer the head than its prefix, so it is evicted first; unhashed (partial) blocks go to
        the head, since nothing can hit them.
        """
        self._check_owned(blocks)
        for block, count in Counter(blocks).items():
            if count > block.ref_cnt:
                raise ValueError(f"block {block.block_id} freed {count} time(s) with ref_cnt {block.ref_cnt}")
        for block in reversed(blocks):
            block.ref_cnt -= 1
            if block.ref_cnt > 0:
                continue
            self._num_used -= 1
            if block.block_hash is not None:
                self._free.append(block)
            else:
                self._free.appendleft(block)

    def cache_full_block(
        self, block: Block, parent_hash: BlockHash, block_hash: BlockHash, token_ids: Sequence[int]
    ) -> bool:
        """Commit a full block under ``block_hash``; True if it became the indexed block.

        If another block already holds the hash, that one stays canonical: this block keeps the
        hash (so integrity and stats see it as full) but is not indexed and not announced.
        """
        if not self.enable_caching:
            return False
        self._check_owned([block])
        if len(token_ids) != self.block_size:
            raise ValueError(f"a full block has {self.block_size} tokens, got {len(token_ids)}")
        if block.block_hash is not None:
            raise ValueError(f"block {block.block_id} is already committed")
        block.block_hash = block_hash
        block.token_ids = tuple(token_ids)
        block.num_tokens = self.block_size
        if block_hash in self._index:
            return False
        self._index[block_hash] = block
        self._emit([BlockStored(block_hash, parent_hash, block.token_ids, block.block_id)])
        return True

    def get_cached_block(self, block_hash: BlockHash, token_ids: Sequence[int]) -> Block | None:
        """The indexed block for ``block_hash`` if its tokens match; does not modify the pool."""
        block = self._index.get(block_hash)
        if block is None or block.token_ids != tuple(token_ids):
            return None
        return block

    def match_prefix(self, block_hashes: Sequence[BlockHash], token_ids: Sequence[int]) -> list[Block]:
        """Longest run of cached blocks from the first; does not modify the pool.

        Block ``i`` covers ``token_ids[i * block_size : (i + 1) * block_size]``.
        """
        if not self.enable_caching:
            return []
        bs = self.block_size
        hits: list[Block] = []
        for i, block_hash in enumerate(block_hashes):
            chunk = token_ids[i * bs : (i + 1) * bs]
            if len(chunk) < bs:
                break
            block = self.get_cached_block(block_hash, chunk)
            if block is None:
                break
            hits.append(block)
        return hits

    def record_prefix_query(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        if not 0 <= num_hit_tokens <= num_query_tokens:
            raise ValueError(f"need 0 <= hits ({num_hit_tokens}) <= queries ({num_query_tokens})")
        self._query_tokens += num_query_tokens
        self._hit_tokens += num_hit_tokens

    def subscribe(self, callback: Callable[[BlockEvent], None]) -> None:
        """Deliver every later event to ``callback``, synchronously and in order."""
        self._subscribers.append(callback)

    def reset_prefix_cache(self) -> bool:
        """Forget every hash; refused (False) while any block is in use."""
        if self._num_used > 0:
            return False
        for block in self.blocks:
            block.reset_hash()
        self._index.clear()
        self._emit([AllBlocksCleared()])
        return True

    def stats(self) -> PoolStats:
        used = cached = filled = 0
        for block in self.blocks:
            if block.ref_cnt > 0:
                used += 1
                filled += block.num_tokens
            elif block.block_hash is not None:
                cached += 1
        allocated_slots = used * self.block_size
        return PoolStats(
            block_size=self.block_size,
            blocks_total=self.num_blocks,
            blocks_used=used,
            blocks_cached=cached,
            blocks_free=self.num_blocks - used - cached,
            blocks_peak_used=self._peak_used,
            prefix_cache_queries_tokens=self._query_tokens,
            prefix_cache_hits_tokens=self._hit_tokens,
            fragmentation=(allocated_slots - filled) / allocated_slots if allocated_slots else 0.0,
        )

    def check_integrity(self) -> None:
        """Raise PoolIntegrityError if any bookkeeping invariant is broken."""
        queued = self._free.check_links(max_len=self.num_blocks)
        if not all(self._owns(b) for b in queued) or len({id(b) for b in queued}) != len(queued):
            raise PoolIntegrityError(f"free queue holds foreign or repeated blocks: {queued}")
        bs = self.block_size
        used = cached = free = 0
        for i, block in enumerate(self.blocks):
            if block.block_id != i:
                raise PoolIntegrityError(f"blocks[{i}] has block_id {block.block_id}")
            if block.ref_cnt < 0:
                raise PoolIntegrityError(f"block {i} has ref_cnt {block.ref_cnt}")
            if (block.prev_free is not None) != (block.ref_cnt == 0):
                raise PoolIntegrityError(f"block {i} with ref_cnt {block.ref_cnt} is (not) queued")
            if not 0 <= block.num_tokens <= bs:
                raise PoolIntegrityError(f"block {i} has num_tokens {block.num_tokens}")
            if block.block_hash is not None and len(block.token_ids) != bs:
                raise PoolIntegrityError(f"hashed block {i} holds {len(block.token_ids)} tokens")
            if block.ref_cnt > 0:
                used += 1
            elif block.block_hash is not None:
                cached += 1
            else:
                free += 1
        if used + cached + free != self.num_blocks or len(queued) != cached + free:
            raise PoolIntegrityError(f"used {used} + cached {cached} + free {free}, {len(queued)} queued")
        if used != self._num_used or used > self._peak_used:
            raise PoolIntegrityError(f"{used} used, counter {self._num_used}, peak {self._peak_used}")
        for block_hash, block in self._index.items():
            if not self._owns(block) or block.block_hash != block_hash or len(block.token_ids) != bs:
                raise PoolIntegrityError(f"index entry {block_hash.hex()} -> block {block.block_id} is stale")

    def _owns(self, block: Block) -> bool:
        return 0 <= block.block_id < self.num_blocks and self.blocks[block.block_id] is block

    def _check_owned(self, blocks: Sequence[Block]) -> None:
        for block in blocks:
            if not self._owns(block):
                raise ValueError(f"block {block.block_id} does not belong to this pool")

    def _emit(self, events: Sequence[BlockEvent]) -> None:
        for event in events:
            for callback in self._subscribers:
                callback(event)
