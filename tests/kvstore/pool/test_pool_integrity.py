"""Misuse raises and leaves the pool intact; corruption is caught by check_integrity."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvstore.errors import PoolIntegrityError
from kvstore.pool.block import Block
from kvstore.pool.block_pool import BlockPool
from tests.kvstore._helpers import commit, ids


def busy_pool() -> BlockPool:
    """10 blocks of 4: 0-1 used and cached, 2 used and partial, 3-4 cached and free, 5-9 free."""
    pool = BlockPool(num_blocks=10, block_size=4)
    seq = pool.allocate(3)
    old = pool.allocate(2)
    assert seq is not None and old is not None
    commit(pool, seq, list(range(9)))
    seq[2].num_tokens = 1
    commit(pool, old, [5] * 8)
    pool.free(old)
    pool.check_integrity()
    return pool


def test_misuse_and_corruption_raise_different_types() -> None:
    """A caller's mistake is a ValueError it may catch; a broken invariant is a bookkeeping bug,
    a PoolIntegrityError (RuntimeError), which no `except ValueError` swallows."""
    pool = busy_pool()
    with pytest.raises(ValueError) as misuse:
        pool.free([pool.blocks[5]])  # free already
    assert not isinstance(misuse.value, PoolIntegrityError)
    pool.blocks[7].ref_cnt = 1  # a free block that claims a reference
    with pytest.raises(PoolIntegrityError) as corrupt:
        pool.check_integrity()
    assert isinstance(corrupt.value, RuntimeError) and not isinstance(corrupt.value, ValueError)


def test_free_of_unreferenced_block_raises_and_changes_nothing() -> None:
    pool = busy_pool()
    before = pool.stats()
    refs = [b.ref_cnt for b in pool.blocks]
    with pytest.raises(ValueError):
        pool.free([pool.blocks[0], pool.blocks[5]])  # block 5 is free: nothing may move
    with pytest.raises(ValueError):
        pool.free([pool.blocks[2], pool.blocks[2]])  # ref_cnt 1, freed twice
    with pytest.raises(ValueError):
        pool.free([Block(block_id=0, ref_cnt=1)])  # not this pool's block
    pool.check_integrity()
    assert pool.stats() == before
    assert [b.ref_cnt for b in pool.blocks] == refs
    assert ids(pool.allocate(7)) == [5, 6, 7, 8, 9, 4, 3]
    pool.check_integrity()


def test_touch_of_foreign_block_raises() -> None:
    pool = busy_pool()
    with pytest.raises(ValueError):
        pool.touch([BlockPool(1, 4).blocks[0]])
    pool.check_integrity()


def _tamper_ref_to_zero(p: BlockPool) -> None:
    p.blocks[0].ref_cnt = 0


def _tamper_ref_negative(p: BlockPool) -> None:
    p.blocks[5].ref_cnt = -1


def _tamper_ref_of_free_block(p: BlockPool) -> None:
    p.blocks[5].ref_cnt = 1


def _tamper_extra_ref(p: BlockPool) -> None:
    p.blocks[0].ref_cnt += 1
    p.blocks[2].ref_cnt -= 1  # still > 0 overall, but block 2 is now "free" yet not queued


def _tamper_forward_link(p: BlockPool) -> None:
    p.blocks[6].next_free = p.blocks[8]


def _tamper_back_link(p: BlockPool) -> None:
    p.blocks[7].prev_free = p.blocks[5]


def _tamper_cycle(p: BlockPool) -> None:
    p.blocks[9].next_free = p.blocks[5]
    p.blocks[5].prev_free = p.blocks[9]


def _tamper_num_tokens(p: BlockPool) -> None:
    p.blocks[2].num_tokens = 5


def _tamper_hashed_token_count(p: BlockPool) -> None:
    p.blocks[3].token_ids = (1, 2, 3)


def _tamper_index_hash(p: BlockPool) -> None:
    p.blocks[0].block_hash = b"\x09" * 32


def _tamper_block_id(p: BlockPool) -> None:
    p.blocks[4].block_id = 7


def _tamper_swap_refs(p: BlockPool) -> None:
    p.blocks[1].ref_cnt = 0
    p.blocks[5].ref_cnt = 1  # totals still add up, but the queue no longer matches refcounts


def _tamper_used_counter(p: BlockPool) -> None:
    p._num_used -= 1


@pytest.mark.parametrize(
    "tamper",
    [
        _tamper_ref_to_zero,
        _tamper_ref_negative,
        _tamper_ref_of_free_block,
        _tamper_extra_ref,
        _tamper_forward_link,
        _tamper_back_link,
        _tamper_cycle,
        _tamper_num_tokens,
        _tamper_hashed_token_count,
        _tamper_index_hash,
        _tamper_block_id,
        _tamper_swap_refs,
        _tamper_used_counter,
    ],
)
def test_check_integrity_detects_corruption(tamper: Callable[[BlockPool], None]) -> None:
    pool = busy_pool()
    tamper(pool)
    with pytest.raises(PoolIntegrityError):
        pool.check_integrity()
