"""The pool's streaming block loader (workers/engine/kernels/block_writer.py, csrc/block_copy.cpp): every
block lands where KVCache.write_block puts it, whatever the alignment of its source and of its
runs in the pool; bad lengths, repeated blocks and block ids outside the pool raise before
anything is written."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvstore.layout import KVLayout
from kvstore.pool.kv_cache import KVCache
from workers.engine.kernels import block_writer

pytestmark = pytest.mark.skipif(not block_writer.available(), reason="the CPU kernels did not build here")

LAYOUTS = [
    KVLayout(num_layers=3, num_kv_heads=4, head_dim=64, block_size=16, dtype=torch.float32),
    # runs of 2 x 2 x 5 x 2 = 40 bytes: never a whole 64-byte line, never aligned twice in a row
    KVLayout(num_layers=2, num_kv_heads=2, head_dim=5, block_size=2, dtype=torch.bfloat16),
    # runs of 2 x 1 x 50 x 2 = 200 bytes: a misaligned head, streamed lines and a tail in each
    KVLayout(num_layers=2, num_kv_heads=1, head_dim=50, block_size=2, dtype=torch.bfloat16),
]


def _blocks(layout: KVLayout, num_blocks: int, seed: int) -> list[bytes]:
    cache = KVCache(layout, num_blocks, "cpu")
    gen = torch.Generator().manual_seed(seed)
    cache.tensor.copy_(torch.randn(cache.tensor.shape, generator=gen).to(layout.dtype))
    return [cache.read_block(b) for b in range(num_blocks)]


@pytest.mark.parametrize("layout", LAYOUTS, ids=["fp32", "bf16-short-runs", "bf16-200-byte-runs"])
@pytest.mark.parametrize("offset", [0, 3], ids=["aligned-source", "misaligned-source"])
def test_streamed_blocks_land_where_write_block_puts_them(layout: KVLayout, offset: int) -> None:
    count = 40
    blocks = _blocks(layout, count, seed=1)
    want, got = KVCache(layout, count + 9, "cpu"), KVCache(layout, count + 9, "cpu")
    got.tensor.fill_(7)  # every byte a load does not cover must stay as it was
    want.tensor.fill_(7)
    targets = [(5 * b + 4) % (count + 9) for b in range(count)]
    # each block read from inside a larger buffer at `offset`: received packs are not aligned
    sources = []
    for data in blocks:
        buffer = bytearray(offset + len(data) + 5)
        buffer[offset : offset + len(data)] = data
        sources.append(memoryview(buffer)[offset : offset + len(data)].toreadonly())
    for target, data in zip(targets, blocks, strict=True):
        want.write_block(target, data)
    calls = []

    def streamed(pool: torch.Tensor, block_size: int, loads: list[tuple[int, memoryview]]) -> None:
        calls.append(len(loads))
        block_writer.write_blocks(pool, block_size, loads)

    got.block_writer = streamed
    got.write_block = None  # type: ignore[assignment,method-assign]  # the numpy path must not run
    got.write_blocks(list(zip(targets, sources, strict=True)))
    assert calls == [count]
    assert torch.equal(want.tensor.view(torch.uint8), got.tensor.view(torch.uint8))


def test_a_short_block_raises_before_any_block_is_written() -> None:
    layout = LAYOUTS[0]
    blocks = _blocks(layout, 4, seed=2)
    cache = KVCache(layout, 4, "cpu")
    with pytest.raises(ValueError, match="block 3: got"):
        block_writer.write_blocks(cache.tensor, layout.block_size, [(0, blocks[0]), (3, blocks[3][:-4])])
    assert not cache.tensor.any()


def test_a_block_loaded_twice_in_one_call_raises_before_any_block_is_written() -> None:
    layout = LAYOUTS[0]
    blocks = _blocks(layout, 2, seed=4)
    cache = KVCache(layout, 4, "cpu")
    with pytest.raises(ValueError, match="loaded twice"):
        block_writer.write_blocks(cache.tensor, layout.block_size, [(1, blocks[0]), (1, blocks[1])])
    assert not cache.tensor.any()


@pytest.mark.parametrize("block_id", [-1, 4])
def test_a_block_id_outside_the_pool_raises_before_any_block_is_written(block_id: int) -> None:
    layout = LAYOUTS[0]
    blocks = _blocks(layout, 2, seed=3)
    cache = KVCache(layout, 4, "cpu")
    with pytest.raises(RuntimeError, match="not in the pool"):
        block_writer.write_blocks(cache.tensor, layout.block_size, [(1, blocks[0]), (block_id, blocks[1])])
    assert not cache.tensor.any()


def test_an_empty_load_writes_nothing() -> None:
    cache = KVCache(LAYOUTS[0], 2, "cpu")
    block_writer.write_blocks(cache.tensor, LAYOUTS[0].block_size, [])
    assert not np.asarray(cache.tensor).any()
