"""Prefix index, hit verification and the event stream."""

from __future__ import annotations

import pytest

from kvstore.chain import hash_blocks, root_hash
from kvstore.pool.block_pool import BlockPool
from kvstore.pool.events import AllBlocksCleared, BlockEvent, BlockRemoved, BlockStored
from tests.kvstore._helpers import EXTRA_KEYS, commit, ids

BS = 4


@pytest.fixture
def pool() -> BlockPool:
    return BlockPool(num_blocks=10, block_size=BS)


@pytest.fixture
def events(pool: BlockPool) -> list[BlockEvent]:
    seen: list[BlockEvent] = []
    pool.subscribe(seen.append)
    return seen


def test_events_in_exact_order(pool: BlockPool, events: list[BlockEvent]) -> None:
    seq = pool.allocate(3)
    assert seq is not None and events == []
    tokens = list(range(100, 100 + 3 * BS))
    h = commit(pool, seq, tokens)
    pool.check_integrity()
    root = root_hash(EXTRA_KEYS)
    assert events == [
        BlockStored(h[0], root, (100, 101, 102, 103), 0),
        BlockStored(h[1], h[0], (104, 105, 106, 107), 1),
        BlockStored(h[2], h[1], (108, 109, 110, 111), 2),
    ]
    events.clear()
    assert pool.reset_prefix_cache() is False  # blocks in use
    pool.free(seq)
    pool.check_integrity()
    assert events == []  # freeing keeps blocks cached
    assert ids(pool.allocate(8)) == [3, 4, 5, 6, 7, 8, 9, 2]
    pool.check_integrity()
    assert events == [BlockRemoved(h[2], 2)]
    assert ids(pool.allocate(1)) == [1]
    pool.check_integrity()
    assert events == [BlockRemoved(h[2], 2), BlockRemoved(h[1], 1)]
    assert pool.get_cached_block(h[1], tokens[BS : 2 * BS]) is None
    assert pool.get_cached_block(h[0], tokens[:BS]) is pool.blocks[0]


def test_reset_prefix_cache(pool: BlockPool, events: list[BlockEvent]) -> None:
    seq = pool.allocate(2)
    assert seq is not None
    tokens = list(range(2 * BS))
    h = commit(pool, seq, tokens)
    pool.free(seq)
    pool.check_integrity()
    events.clear()
    assert pool.stats().blocks_cached == 2
    assert pool.reset_prefix_cache() is True
    pool.check_integrity()
    assert events == [AllBlocksCleared()]
    assert pool.match_prefix(h, tokens) == []
    assert pool.stats().blocks_cached == 0 and pool.stats().blocks_free == 10
    assert all(b.block_hash is None and b.token_ids == () for b in pool.blocks)
    assert ids(pool.allocate(10)) == [2, 3, 4, 5, 6, 7, 8, 9, 1, 0]
    pool.check_integrity()
    assert events == [AllBlocksCleared()]  # nothing hashed left to remove


def test_token_mismatch_under_same_hash_is_a_miss(pool: BlockPool) -> None:
    seq = pool.allocate(2)
    assert seq is not None
    tokens = list(range(2 * BS))
    h = commit(pool, seq, tokens)
    pool.check_integrity()
    assert pool.get_cached_block(h[0], tokens[:BS]) is seq[0]
    assert pool.get_cached_block(h[0], [9, 9, 9, 9]) is None
    assert pool.get_cached_block(b"\x01" * 32, tokens[:BS]) is None
    bad = [*tokens[:BS], 9, 9, 9, 9]
    assert pool.match_prefix(h, bad) == [seq[0]]
    assert pool.match_prefix(h, tokens) == seq
    assert pool.match_prefix(h, tokens[: 2 * BS - 1]) == [seq[0]]  # second block not covered
    assert pool.match_prefix(list(reversed(h)), tokens) == []  # stops at the first miss
    assert [b.ref_cnt for b in seq] == [1, 1]  # lookups change nothing
    pool.check_integrity()


def test_duplicate_hash_second_block_not_indexed(pool: BlockPool, events: list[BlockEvent]) -> None:
    a = pool.allocate(1)
    b = pool.allocate(1)
    assert a is not None and b is not None
    tokens = [7, 7, 7, 7]
    (h,) = hash_blocks(tokens, BS, EXTRA_KEYS)
    root = root_hash(EXTRA_KEYS)
    assert pool.cache_full_block(a[0], root, h, tokens) is True
    assert pool.cache_full_block(b[0], root, h, tokens) is False
    pool.check_integrity()
    assert b[0].block_hash == h and b[0].token_ids == (7, 7, 7, 7)
    assert events == [BlockStored(h, root, (7, 7, 7, 7), 0)]
    assert pool.get_cached_block(h, tokens) is a[0]
    pool.free(b)
    pool.free(a)
    pool.check_integrity()
    # Queue: 2..9, 1, 0. Evicting the duplicate (1) must not drop the canonical entry.
    assert ids(pool.allocate(9)) == [2, 3, 4, 5, 6, 7, 8, 9, 1]
    pool.check_integrity()
    assert events == [BlockStored(h, root, (7, 7, 7, 7), 0)]
    assert pool.get_cached_block(h, tokens) is a[0]
    assert ids(pool.allocate(1)) == [0]
    pool.check_integrity()
    assert events[-1] == BlockRemoved(h, 0)
    assert pool.get_cached_block(h, tokens) is None


def test_cache_full_block_validates(pool: BlockPool) -> None:
    a = pool.allocate(1)
    assert a is not None
    root = root_hash(EXTRA_KEYS)
    with pytest.raises(ValueError):
        pool.cache_full_block(a[0], root, b"\x02" * 32, [1, 2, 3])
    pool.check_integrity()
    assert a[0].block_hash is None
    assert pool.cache_full_block(a[0], root, b"\x02" * 32, [1, 2, 3, 4]) is True
    with pytest.raises(ValueError):
        pool.cache_full_block(a[0], root, b"\x03" * 32, [1, 2, 3, 4])
    pool.check_integrity()
    assert a[0].block_hash == b"\x02" * 32


def test_caching_disabled_commit_is_a_no_op(events: list[BlockEvent]) -> None:
    pool = BlockPool(num_blocks=2, block_size=BS, enable_caching=False)
    pool.subscribe(events.append)
    a = pool.allocate(1)
    assert a is not None
    assert pool.cache_full_block(a[0], b"\x00" * 32, b"\x02" * 32, [1, 2, 3, 4]) is False
    pool.check_integrity()
    assert a[0].block_hash is None and a[0].token_ids == () and events == []


def test_events_reach_every_subscriber_in_order(pool: BlockPool) -> None:
    first: list[BlockEvent] = []
    second: list[BlockEvent] = []
    pool.subscribe(first.append)
    pool.subscribe(second.append)
    seq = pool.allocate(10)
    assert seq is not None
    commit(pool, seq, list(range(10 * BS)))
    pool.free(seq)
    pool.check_integrity()
    assert ids(pool.allocate(3)) == [9, 8, 7]
    pool.check_integrity()
    assert [type(e) for e in first] == [BlockStored] * 10 + [BlockRemoved] * 3
    assert [e.block_id for e in first[10:] if isinstance(e, BlockRemoved)] == [9, 8, 7]
    assert first == second
