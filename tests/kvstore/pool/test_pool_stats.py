from __future__ import annotations

import pytest

from kvstore.pool.block_pool import BlockPool
from tests.kvstore._helpers import commit


def test_fresh_pool_stats() -> None:
    pool = BlockPool(num_blocks=10, block_size=16)
    s = pool.stats()
    assert (s.blocks_total, s.blocks_used, s.blocks_cached, s.blocks_free) == (10, 0, 0, 10)
    assert s.usage == 0.0 and s.fragmentation == 0.0 and s.prefix_hit_rate == 0.0
    assert s.blocks_peak_used == 0 and s.block_size == 16


def test_usage_cached_fragmentation_and_peak() -> None:
    pool = BlockPool(num_blocks=10, block_size=4)
    seq = pool.allocate(3)
    assert seq is not None
    hashes = commit(pool, seq, list(range(9)))  # two full blocks, one token in the third
    seq[2].num_tokens = 1
    pool.check_integrity()
    s = pool.stats()
    assert (s.blocks_used, s.blocks_cached, s.blocks_free) == (3, 0, 7)
    assert s.usage == pytest.approx(0.3)
    assert s.fragmentation == pytest.approx(3 / 12)
    assert s.blocks_peak_used == 3

    other = pool.allocate(2)
    assert other is not None
    pool.check_integrity()
    s = pool.stats()
    assert s.blocks_used == 5 and s.blocks_peak_used == 5
    assert s.fragmentation == pytest.approx((20 - 9) / 20)

    pool.free(other)
    pool.free(seq)
    pool.check_integrity()
    s = pool.stats()
    assert (s.blocks_used, s.blocks_cached, s.blocks_free) == (0, 2, 8)
    assert s.usage == 0.0 and s.fragmentation == 0.0
    assert s.blocks_peak_used == 5

    hits = pool.match_prefix(hashes, list(range(8)))
    assert hits == seq[:2]
    pool.touch(hits)
    pool.check_integrity()
    s = pool.stats()
    assert (s.blocks_used, s.blocks_cached, s.blocks_free) == (2, 0, 8)
    assert s.fragmentation == 0.0  # committed blocks count as full
    assert s.blocks_peak_used == 5


def test_touch_updates_peak() -> None:
    pool = BlockPool(num_blocks=4, block_size=4)
    seq = pool.allocate(4)
    assert seq is not None
    commit(pool, seq, list(range(16)))
    pool.free(seq)
    pool.check_integrity()
    pool.touch(seq)
    pool.check_integrity()
    assert pool.stats().blocks_peak_used == 4 and pool.stats().usage == 1.0


def test_prefix_hit_counters_in_tokens() -> None:
    pool = BlockPool(num_blocks=10, block_size=16)
    pool.record_prefix_query(64, 32)
    pool.record_prefix_query(36, 0)
    s = pool.stats()
    assert (s.prefix_cache_queries_tokens, s.prefix_cache_hits_tokens) == (100, 32)
    assert s.prefix_hit_rate == pytest.approx(0.32)
    with pytest.raises(ValueError):
        pool.record_prefix_query(4, 5)
    with pytest.raises(ValueError):
        pool.record_prefix_query(-1, 0)
    assert pool.stats() == s


def test_to_dict() -> None:
    pool = BlockPool(num_blocks=10, block_size=16)
    pool.allocate(5)
    pool.record_prefix_query(10, 5)
    d = pool.stats().to_dict()
    assert d == {
        "block_size": 16,
        "blocks_total": 10,
        "blocks_used": 5,
        "blocks_cached": 0,
        "blocks_free": 5,
        "blocks_peak_used": 5,
        "prefix_cache_queries_tokens": 10,
        "prefix_cache_hits_tokens": 5,
        "fragmentation": 1.0,
        "usage": 0.5,
        "prefix_hit_rate": 0.5,
    }
