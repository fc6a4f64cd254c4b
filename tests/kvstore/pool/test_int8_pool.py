"""An int8 pool (issue 41): each row's values and its own scale, written by KVCache.write, read back
through `dense`, carried by a block's bytes and packs, and never by a lossy tier form."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvstore.layout import KVFormat
from kvstore.pool import int8_rows
from kvstore.pool.kv_cache import KVCache
from kvstore.tiers import quant
from kvstore.tiers.codec import decode_pack, encode_pack
from kvstore.tiers.stored_block import StoredBlock
from tests.kvstore.conftest import TINY_LAYOUT

INT8 = dataclasses.replace(TINY_LAYOUT, dtype=torch.int8)


def test_a_row_keeps_its_values_within_half_a_step_of_its_own_scale() -> None:
    x = (
        torch.randn(5, 3, 16, generator=torch.Generator().manual_seed(1))
        * torch.tensor([0.01, 1.0, 50.0])[:, None]
    )
    x[0, 0] = 0.0  # an all-zero row: scale 1, values 0
    rows = int8_rows.quantize(x)
    assert rows.shape == (5, 3, 20) and rows.dtype == torch.int8
    scale = x.abs().amax(-1, keepdim=True) / 127
    back = int8_rows.dequantize(rows)
    assert torch.all((back - x).abs() <= scale / 2 * (1 + 1e-5))
    assert torch.equal(back[0, 0], torch.zeros(16))
    assert rows[..., :16].abs().max() == 127  # each row's absmax is its own full step


def test_the_pool_holds_values_and_scales_and_reads_back_dequantised() -> None:
    assert INT8.row == 20 and INT8.bytes_per_token == 2 * 2 * 2 * 20
    assert KVFormat.from_layout(INT8, "m") == KVFormat("m", "int8", (2, 2, 16, 2, 20))
    cache = KVCache(INT8, num_blocks=3, device="cpu")
    gen = torch.Generator().manual_seed(2)
    k, v = torch.randn(5, 2, 16, generator=gen), torch.randn(5, 2, 16, generator=gen)
    slots = torch.tensor([0, 1, 17, 18, 40])
    cache.write(1, slots, k, v)
    assert torch.equal(cache.keys(1)[slots], int8_rows.quantize(k))
    assert torch.equal(
        cache.dense(cache.values(1)[slots], torch.float32), int8_rows.dequantize(int8_rows.quantize(v))
    )
    # a block's bytes carry its scales: read on one pool, written on another, the same rows
    other = KVCache(INT8, num_blocks=3, device="cpu")
    other.write_block(2, cache.read_block(1))
    assert torch.equal(other.tensor[:, :, 32:48], cache.tensor[:, :, 16:32])
    assert len(cache.read_block(1)) == KVFormat.from_layout(INT8, "m").nbytes


def test_an_int8_pack_round_trips_exact_and_is_refused_by_another_dtype() -> None:
    cache = KVCache(INT8, num_blocks=2, device="cpu")
    slots = torch.arange(32)
    gen = torch.Generator().manual_seed(3)
    for layer in range(2):
        cache.write(
            layer, slots, torch.randn(32, 2, 16, generator=gen), torch.randn(32, 2, 16, generator=gen)
        )
    fmt = KVFormat.from_layout(INT8, "m+w-f32+kv-int8")
    blocks = [
        StoredBlock(bytes([b]) * 32, bytes(32), tuple(range(16)), cache.read_block(b)) for b in range(2)
    ]
    decoded = decode_pack(fmt, encode_pack(fmt, blocks))
    assert decoded.reason is None and [bytes(b.kv) for b in decoded.blocks] == [b.kv for b in blocks]
    for dtype in ("float32", "bfloat16"):  # even under the same fingerprint, the header's dtype refuses it
        other = KVFormat.from_layout(
            dataclasses.replace(TINY_LAYOUT, dtype=getattr(torch, dtype)), fmt.model_fingerprint
        )
        refused = decode_pack(other, encode_pack(fmt, blocks))
        assert not refused.blocks and refused.reason is not None and "foreign" in refused.reason
    with pytest.raises(ValueError, match="stored exact"):
        quant.encoded_nbytes(fmt, "int8")
