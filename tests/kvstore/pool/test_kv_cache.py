"""KVCache's block copies: read_block / write_block round trips, and write_blocks, which splits a
large load between two threads, lands every block where one thread would."""

from __future__ import annotations

import pytest
import torch

from kvstore.layout import KVLayout
from kvstore.pool.kv_cache import KVCache

# 3 layers x K, V x 16 tokens x 4 heads x 64 x 4 bytes = 96 KiB a block: 100 blocks pass the split size
LAYOUT = KVLayout(num_layers=3, num_kv_heads=4, head_dim=64, block_size=16, dtype=torch.float32)


def _blocks(num_blocks: int) -> list[bytes]:
    cache = KVCache(LAYOUT, num_blocks, "cpu")
    cache.tensor.copy_(torch.randn(cache.tensor.shape, generator=torch.Generator().manual_seed(3)))
    return [cache.read_block(b) for b in range(num_blocks)]


@pytest.mark.parametrize("count", [3, 100], ids=["one-thread", "split"])
def test_write_blocks_lands_every_block_where_write_block_would(count: int) -> None:
    blocks = _blocks(count)
    one, many = KVCache(LAYOUT, count + 7, "cpu"), KVCache(LAYOUT, count + 7, "cpu")
    targets = [(7 * b + 2) % (count + 7) for b in range(count)]  # scattered, none twice
    assert len(set(targets)) == count
    for target, data in zip(targets, blocks, strict=True):
        one.write_block(target, data)
    many.write_blocks([(t, memoryview(d)) for t, d in zip(targets, blocks, strict=True)])
    assert torch.equal(one.tensor, many.tensor)
    assert all(many.read_block(t) == d for t, d in zip(targets, blocks, strict=True))
    assert (many._helper is not None) == (count == 100)


@pytest.mark.parametrize("bad", [0, 1], ids=["this-thread", "helper"])
def test_a_bad_block_in_either_half_raises_and_the_other_half_still_finishes(bad: int) -> None:
    blocks = _blocks(100)
    cache = KVCache(LAYOUT, 100, "cpu")
    loads: list[tuple[int, bytes | memoryview]] = list(enumerate(blocks))
    loads[bad] = (bad, blocks[bad][:-1])
    with pytest.raises(ValueError, match="block bytes"):
        cache.write_blocks(loads)
    assert cache._helper is not None  # the split ran, and the call returned only after both halves
    other = 1 - bad
    assert cache.read_block(other) == blocks[other]
