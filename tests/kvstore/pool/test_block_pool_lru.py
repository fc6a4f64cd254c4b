"""Allocation, refcounts and the exact eviction order of a tiny pool."""

from __future__ import annotations

import pytest

from kvstore.pool.block_pool import BlockPool
from tests.kvstore._helpers import commit, ids

BS = 4


@pytest.fixture
def pool() -> BlockPool:
    p = BlockPool(num_blocks=10, block_size=BS)
    p.check_integrity()
    return p


@pytest.mark.parametrize(("num_blocks", "block_size"), [(0, 4), (4, 0), (-1, 16)])
def test_rejects_bad_sizes(num_blocks: int, block_size: int) -> None:
    with pytest.raises(ValueError):
        BlockPool(num_blocks, block_size)


def test_fresh_pool_allocates_in_id_order(pool: BlockPool) -> None:
    assert ids(pool.allocate(3)) == [0, 1, 2]
    pool.check_integrity()
    assert ids(pool.allocate(2)) == [3, 4]
    pool.check_integrity()
    assert pool.num_free_blocks == 5
    assert all(b.ref_cnt == 1 for b in pool.blocks[:5])


def test_allocate_beyond_capacity_returns_none_and_changes_nothing(pool: BlockPool) -> None:
    assert ids(pool.allocate(7)) == list(range(7))
    pool.check_integrity()
    assert not pool.can_allocate(4) and pool.can_allocate(3)
    before = pool.stats()
    assert pool.allocate(4) is None
    pool.check_integrity()
    assert pool.stats() == before
    assert ids(pool.allocate(3)) == [7, 8, 9]
    pool.check_integrity()
    assert pool.allocate(1) is None
    assert pool.allocate(0) == []
    pool.check_integrity()


def test_sequence_tail_is_evicted_before_its_prefix(pool: BlockPool) -> None:
    seq = pool.allocate(3)
    assert seq is not None
    commit(pool, seq, list(range(3 * BS)))
    pool.check_integrity()
    pool.free(seq)
    pool.check_integrity()
    assert pool.num_free_blocks == 10
    assert ids(pool.allocate(7)) == [3, 4, 5, 6, 7, 8, 9]  # never-used blocks first
    pool.check_integrity()
    for expected in (2, 1, 0):  # then c, b, a
        got = pool.allocate(1)
        pool.check_integrity()
        assert ids(got) == [expected]
        assert got is not None and got[0].block_hash is None and got[0].token_ids == ()


def test_unhashed_blocks_are_reused_before_cached_ones(pool: BlockPool) -> None:
    seq = pool.allocate(3)
    assert seq is not None
    commit(pool, seq, list(range(2 * BS + 1)))  # blocks 0, 1 full; block 2 partial
    assert seq[2].block_hash is None
    pool.check_integrity()
    pool.free(seq)
    pool.check_integrity()
    assert ids(pool.allocate(1)) == [2]
    pool.check_integrity()
    assert ids(pool.allocate(9)) == [3, 4, 5, 6, 7, 8, 9, 1, 0]
    pool.check_integrity()


def test_lru_across_two_sequences(pool: BlockPool) -> None:
    a = pool.allocate(2)
    b = pool.allocate(2)
    assert a is not None and b is not None
    commit(pool, a, [1] * (2 * BS))
    commit(pool, b, [2] * (2 * BS))
    pool.check_integrity()
    pool.free(a)  # freed first: evicted first
    pool.check_integrity()
    pool.free(b)
    pool.check_integrity()
    assert ids(pool.allocate(6)) == [4, 5, 6, 7, 8, 9]
    pool.check_integrity()
    assert ids(pool.allocate(4)) == [1, 0, 3, 2]
    pool.check_integrity()


def test_revive_from_middle_keeps_the_rest_in_order(pool: BlockPool) -> None:
    a = pool.allocate(2)
    b = pool.allocate(2)
    assert a is not None and b is not None
    tokens_a = [1] * (2 * BS)
    hashes_a = commit(pool, a, tokens_a)
    commit(pool, b, [2] * (2 * BS))
    pool.free(a)
    pool.free(b)
    pool.check_integrity()  # queue: 4..9, 1, 0, 3, 2
    hits = pool.match_prefix(hashes_a, tokens_a)
    assert ids(hits) == [0, 1]
    pool.check_integrity()
    pool.touch(hits)
    pool.check_integrity()
    assert [blk.ref_cnt for blk in hits] == [1, 1]
    assert pool.num_free_blocks == 8
    assert ids(pool.allocate(8)) == [4, 5, 6, 7, 8, 9, 3, 2]
    pool.check_integrity()
    assert hits[0].block_hash == hashes_a[0]  # revived blocks kept their hash


def test_shared_prefix_refcounts(pool: BlockPool) -> None:
    a = pool.allocate(2)
    assert a is not None
    tokens = list(range(2 * BS))
    hashes = commit(pool, a, tokens)
    pool.check_integrity()
    prefix = pool.match_prefix(hashes, [*tokens, 99])
    assert prefix == a
    pool.touch(prefix)
    pool.check_integrity()
    own = pool.allocate(1)
    assert own is not None and ids(own) == [2]
    b = [*prefix, *own]
    pool.check_integrity()
    assert [blk.ref_cnt for blk in b] == [2, 2, 1]
    pool.free(a)
    pool.check_integrity()
    assert [blk.ref_cnt for blk in b] == [1, 1, 1]
    assert pool.num_free_blocks == 7
    assert pool.stats().blocks_used == 3
    pool.free(b)
    pool.check_integrity()
    assert pool.stats().blocks_used == 0
    # Block 2 was partial (unhashed): reused first; the shared prefix goes last, tail first.
    assert ids(pool.allocate(10)) == [2, 3, 4, 5, 6, 7, 8, 9, 1, 0]
    pool.check_integrity()


def test_touch_twice_in_one_call_and_free_accordingly(pool: BlockPool) -> None:
    a = pool.allocate(1)
    assert a is not None
    pool.touch([a[0], a[0]])
    pool.check_integrity()
    assert a[0].ref_cnt == 3
    pool.free([a[0], a[0]])
    pool.check_integrity()
    assert a[0].ref_cnt == 1
    pool.free(a)
    pool.check_integrity()
    assert pool.num_free_blocks == 10


def test_caching_disabled_keeps_nothing() -> None:
    pool = BlockPool(num_blocks=4, block_size=BS, enable_caching=False)
    seq = pool.allocate(2)
    assert seq is not None
    tokens = list(range(2 * BS))
    hashes = commit(pool, seq, tokens)
    assert [blk.block_hash for blk in seq] == [None, None]
    pool.check_integrity()
    pool.free(seq)
    pool.check_integrity()
    assert pool.match_prefix(hashes, tokens) == []
    assert pool.stats().blocks_cached == 0
    # Unhashed, freed in reverse to the head: the prefix block ends up first.
    assert ids(pool.allocate(4)) == [0, 1, 2, 3]
    pool.check_integrity()
