"""Compressed cold-tier dtypes: smaller packs, bounded error, a namespace of their own; exact
blocks read as views and go through the warm tier into the pool unchanged."""

from __future__ import annotations

import dataclasses

import pytest
import redis
import torch

from kvstore.layout import KVFormat
from kvstore.pool.kv_cache import KVCache
from kvstore.redis.tier import RedisTier
from kvstore.tiers.codec import decode_pack, encode_pack
from kvstore.tiers.quant import TIER_DTYPES, TierDtype, encoded_nbytes
from kvstore.tiers.stored_block import StoredBlock
from kvstore.tiers.warm import WarmTier
from tests.kvstore.conftest import TINY_LAYOUT, MakeBlocks


def _tensor(block: StoredBlock, fmt: KVFormat) -> torch.Tensor:
    return torch.frombuffer(bytearray(block.kv), dtype=torch.float32).view(fmt.shape)


@pytest.mark.parametrize("tier_dtype", TIER_DTYPES)
def test_round_trip_of_each_dtype(tiny_fmt: KVFormat, make_blocks: MakeBlocks, tier_dtype: TierDtype) -> None:
    blocks = make_blocks(3)
    data = encode_pack(tiny_fmt, blocks, tier_dtype)
    decoded = decode_pack(tiny_fmt, data, tier_dtype)
    assert (decoded.dropped, decoded.reason) == (0, None)
    assert [(b.block_hash, b.parent_hash, b.token_ids) for b in decoded.blocks] == [
        (b.block_hash, b.parent_hash, b.token_ids) for b in blocks
    ]
    assert all(len(b.kv) == tiny_fmt.nbytes for b in decoded.blocks)  # the pool's dtype again
    if tier_dtype == "exact":
        assert decoded.blocks == blocks
    # a lossy pack is smaller: per element 1 byte (int8, plus 4 bytes per layer, K/V and head) or 2
    assert len(data) - 3 * encoded_nbytes(tiny_fmt, tier_dtype) < 1024
    want = {"exact": 8192, "int8": 2048 + 4 * 8, "fp16": 4096, "bf16": 4096}[tier_dtype]
    assert encoded_nbytes(tiny_fmt, tier_dtype) == want


@pytest.mark.parametrize(("tier_dtype", "bound"), [("int8", 0.5 / 127), ("fp16", 2**-11), ("bf16", 2**-8)])
def test_lossy_error_is_bounded(
    tiny_fmt: KVFormat, make_blocks: MakeBlocks, tier_dtype: TierDtype, bound: float
) -> None:
    """int8: |error| <= scale / 2 = absmax / 254 per (layer, K or V, head); fp16/bf16: relative
    rounding of the mantissa."""
    blocks = make_blocks(4)
    decoded = decode_pack(tiny_fmt, encode_pack(tiny_fmt, blocks, tier_dtype), tier_dtype).blocks
    for block, back in zip(blocks, decoded, strict=True):
        x, y = _tensor(block, tiny_fmt), _tensor(back, tiny_fmt)
        if tier_dtype == "int8":
            absmax = x.abs().amax(dim=(2, 4), keepdim=True)  # [layers, 2, 1, heads, 1]
            assert ((x - y).abs() <= absmax * bound * 1.0001).all()
        else:
            assert ((x - y).abs() <= x.abs() * bound * 1.0001 + 1e-30).all()
        assert not torch.equal(x, y)


def test_int8_of_a_zero_block_is_zero(tiny_fmt: KVFormat, make_blocks: MakeBlocks) -> None:
    block = dataclasses.replace(make_blocks(1)[0], kv=bytes(tiny_fmt.nbytes))
    back = decode_pack(tiny_fmt, encode_pack(tiny_fmt, [block], "int8"), "int8").blocks
    assert back[0].kv == block.kv


def test_flipped_byte_of_an_int8_pack_drops_that_block(tiny_fmt: KVFormat, make_blocks: MakeBlocks) -> None:
    blocks = make_blocks(3)
    data = bytearray(encode_pack(tiny_fmt, blocks, "int8"))
    data[len(data) - encoded_nbytes(tiny_fmt, "int8") + 7] ^= 0x01  # block 2's scales
    decoded = decode_pack(tiny_fmt, bytes(data), "int8")
    assert [b.block_hash for b in decoded.blocks] == [b.block_hash for b in blocks[:2]]
    assert decoded.reason == "block 2: checksum mismatch"


@pytest.mark.parametrize(("written", "read"), [("exact", "int8"), ("int8", "exact"), ("fp16", "bf16")])
def test_a_pack_of_another_tier_dtype_is_foreign(
    tiny_fmt: KVFormat, make_blocks: MakeBlocks, written: TierDtype, read: TierDtype
) -> None:
    decoded = decode_pack(tiny_fmt, encode_pack(tiny_fmt, make_blocks(2), written), read)
    assert decoded.blocks == []
    assert decoded.reason is not None and decoded.reason.startswith("foreign pack:")


def test_exact_and_int8_tiers_are_separate_namespaces(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    exact = RedisTier(redis_client, tiny_fmt, 1 << 20, blocks_per_pack=2)
    int8 = RedisTier(redis_client, tiny_fmt, 1 << 20, blocks_per_pack=2, tier_dtype="int8")
    assert exact.keys.prefix != int8.keys.prefix and not int8.keys.prefix.startswith(exact.keys.pattern[:-1])
    blocks = make_blocks(4)
    hashes = [b.block_hash for b in blocks]
    assert int8.put(blocks) == 4
    assert exact.get_run(hashes) == []  # an exact worker never sees lossy blocks
    got = int8.get_run(hashes, [b.token_ids for b in blocks])
    assert [b.block_hash for b in got] == hashes
    assert exact.put(blocks[:2]) == 2
    assert exact.get_run(hashes) == blocks[:2]
    assert int8.stats().bytes_stored < exact.stats().bytes_stored  # 4 int8 blocks < 2 exact ones
    int8.pin_session("t", "s1", hashes)
    exact.check_integrity()
    int8.check_integrity()
    int8.clear()
    assert exact.get_run(hashes) == blocks[:2]
    with pytest.raises(ValueError, match="tier dtype"):
        RedisTier(redis_client, tiny_fmt, 1 << 20, tier_dtype="fp8")


def test_views_from_redis_go_through_the_warm_tier_into_the_pool(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    blocks = make_blocks(5)
    tier = RedisTier(redis_client, tiny_fmt, 1 << 20, blocks_per_pack=2)
    tier.put(blocks)
    run = tier.get_run([b.block_hash for b in blocks])
    assert all(isinstance(b.kv, memoryview) for b in run)
    warm = WarmTier(10 * tiny_fmt.nbytes)
    for block in run:
        warm.put(block)
    assert warm.nbytes == 5 * tiny_fmt.nbytes
    pool = KVCache(TINY_LAYOUT, num_blocks=6, device="cpu")
    for b, block in enumerate(warm.get_run([b.block_hash for b in blocks])):
        pool.write_block(b + 1, block.kv)
    for b, block in enumerate(blocks):
        got = pool.tensor[:, :, (b + 1) * 16 : (b + 2) * 16].contiguous().view(torch.uint8).numpy().tobytes()
        assert got == block.kv
    with pytest.raises(ValueError, match="block bytes"):
        pool.write_block(0, run[0].kv[:-1])
