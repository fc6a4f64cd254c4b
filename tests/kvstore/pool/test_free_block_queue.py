from __future__ import annotations

import pytest

from kvstore.pool.block import Block
from kvstore.pool.free_queue import FreeBlockQueue


def make(n: int) -> tuple[list[Block], FreeBlockQueue]:
    blocks = [Block(block_id=i) for i in range(n)]
    return blocks, FreeBlockQueue(blocks)


def order(q: FreeBlockQueue) -> list[int]:
    q.check_links(max_len=100)
    return [b.block_id for b in q]


def test_initial_order_and_popleft() -> None:
    _, q = make(4)
    assert len(q) == 4 and order(q) == [0, 1, 2, 3]
    assert q.popleft().block_id == 0
    assert order(q) == [1, 2, 3] and len(q) == 3


def test_remove_from_middle_head_and_tail() -> None:
    blocks, q = make(5)
    q.remove(blocks[2])
    assert order(q) == [0, 1, 3, 4]
    q.remove(blocks[0])
    q.remove(blocks[4])
    assert order(q) == [1, 3]
    assert blocks[2].prev_free is None and blocks[2].next_free is None


def test_append_and_appendleft() -> None:
    blocks, q = make(3)
    q.remove(blocks[1])
    q.append(blocks[1])
    assert order(q) == [0, 2, 1]
    q.remove(blocks[1])
    q.appendleft(blocks[1])
    assert order(q) == [1, 0, 2]


def test_empty_pop_and_misuse_raise() -> None:
    blocks, q = make(1)
    q.popleft()
    with pytest.raises(IndexError):
        q.popleft()
    with pytest.raises(ValueError):
        q.remove(blocks[0])
    q.append(blocks[0])
    with pytest.raises(ValueError):
        q.appendleft(blocks[0])
    assert order(q) == [0]
