"""The free queue: an intrusive doubly linked list of blocks with ref_cnt == 0.

Intrusive (links live on the Block) so that a cached block can be revived from the middle in
O(1) when a prefix hit finds it. The head is reused (and, if hashed, evicted) first.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from kvstore.errors import PoolIntegrityError
from kvstore.pool.block import Block


class FreeBlockQueue:
    def __init__(self, blocks: Iterable[Block] = ()) -> None:
        # Sentinels keep every real block's links non-None while queued, so "is it queued?"
        # is a link check and no insertion or removal needs an edge case.
        self._head = Block(block_id=-1)
        self._tail = Block(block_id=-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self._len = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Block]:
        node = self._head.next_free
        while node is not None and node is not self._tail:
            yield node
            node = node.next_free

    def popleft(self) -> Block:
        block = self._head.next_free
        if block is None or block is self._tail:
            raise IndexError("pop from an empty free block queue")
        self.remove(block)
        return block

    def remove(self, block: Block) -> None:
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self._len -= 1

    def append(self, block: Block) -> None:
        last = self._tail.prev_free
        assert last is not None
        self._link(block, last, self._tail)

    def appendleft(self, block: Block) -> None:
        first = self._head.next_free
        assert first is not None
        self._link(block, self._head, first)

    def _link(self, block: Block, prev: Block, nxt: Block) -> None:
        if block.prev_free is not None or block.next_free is not None:
            raise ValueError(f"block {block.block_id} is already in the free queue")
        block.prev_free, block.next_free = prev, nxt
        prev.next_free = block
        nxt.prev_free = block
        self._len += 1

    def check_links(self, max_len: int) -> list[Block]:
        """Walk head to tail checking both directions; return the queued blocks in order.

        ``max_len`` bounds the walk so that a corrupted (cyclic) list raises instead of hanging.
        """
        if self._head.prev_free is not None or self._tail.next_free is not None:
            raise PoolIntegrityError("free queue sentinels are linked outward")
        out: list[Block] = []
        node = self._head
        while node is not self._tail:
            nxt = node.next_free
            if nxt is None:
                raise PoolIntegrityError(f"free queue breaks after block {node.block_id}")
            if nxt.prev_free is not node:
                raise PoolIntegrityError(f"free queue back link of block {nxt.block_id} is wrong")
            if nxt is not self._tail:
                out.append(nxt)
                if len(out) > max_len:
                    raise PoolIntegrityError("free queue is longer than the pool (a cycle?)")
            node = nxt
        if len(out) != self._len:
            raise PoolIntegrityError(f"free queue holds {len(out)} blocks but counts {self._len}")
        return out
