"""Pack encoding: exact round trips; every kind of bad bytes drops blocks and never raises."""

from __future__ import annotations

import dataclasses
import random
import struct
from typing import Any

import msgpack
import pytest
import torch

from kvstore.layout import KVFormat, KVLayout
from kvstore.pool.kv_cache import KVCache
from kvstore.tiers.codec import MAGIC, PACK_MAGIC, decode_pack, encode_pack
from tests.kvstore.conftest import TINY_LAYOUT, MakeBlocks


def test_format_from_layout_matches_the_pool(tiny_fmt: KVFormat) -> None:
    assert tiny_fmt == KVFormat("tiny-test", "float32", (2, 2, 16, 2, 16), 2)
    assert tiny_fmt.nbytes == TINY_LAYOUT.bytes_per_block == 8192
    assert tiny_fmt.block_size == 16
    smollm2 = KVLayout(num_layers=30, num_kv_heads=3, head_dim=64, block_size=16, dtype=torch.float32)
    assert KVFormat.from_layout(smollm2, "m").nbytes == 737_280
    bf16 = dataclasses.replace(TINY_LAYOUT, dtype=torch.bfloat16)
    assert KVFormat.from_layout(bf16, "m").dtype == "bfloat16"


@pytest.mark.parametrize(
    ("dtype", "shape"),
    [("int4", (2, 2, 16, 2, 16)), ("float32", (2, 2, 16, 2)), ("float32", (2, 3, 16, 2, 16))],
)
def test_format_rejects_bad_dtype_or_shape(dtype: str, shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError):
        KVFormat("m", dtype, shape)


def test_round_trip_is_exact(tiny_fmt: KVFormat, make_blocks: MakeBlocks) -> None:
    blocks = make_blocks(5)
    decoded = decode_pack(tiny_fmt, encode_pack(tiny_fmt, blocks))
    assert decoded.blocks == blocks
    assert (decoded.dropped, decoded.reason) == (0, None)


def test_round_trip_restores_the_pool_tensor(make_blocks: MakeBlocks) -> None:
    layout = dataclasses.replace(TINY_LAYOUT, dtype=torch.bfloat16)
    fmt = KVFormat.from_layout(layout, "tiny-test")
    blocks = make_blocks(3, layout=layout)
    decoded = decode_pack(fmt, encode_pack(fmt, blocks))
    target = KVCache(layout, num_blocks=3, device="cpu")
    for b, block in enumerate(decoded.blocks):
        raw = torch.frombuffer(bytearray(block.kv), dtype=torch.uint8).view(layout.dtype).view(fmt.shape)
        target.tensor[:, :, b * 16 : (b + 1) * 16] = raw
    for b, block in enumerate(blocks):
        assert (
            target.tensor[:, :, b * 16 : (b + 1) * 16].contiguous().view(torch.uint8).numpy().tobytes()
            == block.kv
        )


def test_flipped_kv_byte_drops_only_that_block(tiny_fmt: KVFormat, make_blocks: MakeBlocks) -> None:
    blocks = make_blocks(4)
    data = bytearray(encode_pack(tiny_fmt, blocks))
    data[data.find(blocks[2].kv) + 1000] ^= 0x01
    decoded = decode_pack(tiny_fmt, bytes(data))
    assert decoded.blocks == [blocks[0], blocks[1], blocks[3]]
    assert decoded.dropped == 1
    assert decoded.reason == "block 2: checksum mismatch"


def test_flipped_hash_byte_drops_that_block(tiny_fmt: KVFormat, make_blocks: MakeBlocks) -> None:
    blocks = make_blocks(3)
    data = bytearray(encode_pack(tiny_fmt, blocks))
    data[data.find(blocks[0].block_hash) + 5] ^= 0x80
    decoded = decode_pack(tiny_fmt, bytes(data))
    assert decoded.blocks == blocks[1:]
    assert decoded.dropped == 1


def test_truncated_pack_drops_everything_without_raising(tiny_fmt: KVFormat, make_blocks: MakeBlocks) -> None:
    data = encode_pack(tiny_fmt, make_blocks(3))
    for cut in [0, 1, 10, 100, len(data) // 2, len(data) - 1]:
        decoded = decode_pack(tiny_fmt, data[:cut])
        assert decoded.blocks == [] and decoded.dropped in (1, 3)
        assert decoded.reason is not None and decoded.reason.startswith(("undecodable", "foreign"))


def _split(data: bytes) -> tuple[dict[str, Any], bytes]:
    """A layout-2 pack as (header map, payload)."""
    magic, size = struct.unpack_from("<4sI", data)
    assert magic == PACK_MAGIC
    return msgpack.unpackb(data[8 : 8 + size]), data[8 + size :]


def _join(header: dict[str, Any], payload: bytes) -> bytes:
    packed = msgpack.packb(header)
    return struct.pack("<4sI", PACK_MAGIC, len(packed)) + packed + payload


@pytest.mark.parametrize(
    "garbage",
    [
        b"",
        b"\x00",
        b"\xc1",  # never used in msgpack
        bytes(range(256)) * 8,
        msgpack.packb([1, 2, 3]),
        msgpack.packb({"magic": "kvferry-kv"}),  # a layout-1 pack's start
        PACK_MAGIC + struct.pack("<I", 2**31) + b"x" * 64,  # a header longer than the pack
        _join({"magic": "kvferry-kv"}, b""),  # no format fields
        _join([1, 2], b""),  # type: ignore[arg-type]
        encode_pack(KVFormat("tiny-test", "float32", (2, 2, 16, 2, 16)), []) + b"extra",
    ],
)
def test_garbage_drops_everything_without_raising(tiny_fmt: KVFormat, garbage: bytes) -> None:
    decoded = decode_pack(tiny_fmt, garbage)
    assert decoded.blocks == []
    assert decoded.dropped == 1
    assert decoded.reason is not None


def test_layout_1_pack_is_foreign(tiny_fmt: KVFormat, make_blocks: MakeBlocks) -> None:
    """What the previous release wrote (one msgpack map, blake2b checksums) reads as foreign."""
    blocks = make_blocks(2)
    old = {
        "magic": MAGIC,
        "layout_version": 1,
        "model_fingerprint": "tiny-test",
        "dtype": "float32",
        "shape": [2, 2, 16, 2, 16],
        "blocks": [
            {
                "hash": b.block_hash,
                "parent": b.parent_hash,
                "tokens": list(b.token_ids),
                "kv": b.kv,
                "checksum": b"\x00" * 16,
            }
            for b in blocks
        ],
    }
    decoded = decode_pack(tiny_fmt, msgpack.packb(old, use_bin_type=True))
    assert decoded.blocks == []
    assert decoded.reason is not None and decoded.reason.startswith("foreign pack")
    header, payload = _split(encode_pack(tiny_fmt, blocks))
    header["layout_version"] = 1
    assert decode_pack(tiny_fmt, _join(header, payload)).reason == (
        "foreign pack: layout_version is 1, expected 2"
    )


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"model_fingerprint": "other-model"}, "model_fingerprint"),
        ({"dtype": "float16"}, "dtype"),
        ({"shape": (2, 2, 16, 4, 8)}, "shape"),  # same byte count, another head split
        ({"layout_version": 3}, "layout_version"),
    ],
)
def test_foreign_format_drops_every_block(
    tiny_fmt: KVFormat, make_blocks: MakeBlocks, change: dict[str, object], field: str
) -> None:
    foreign = dataclasses.replace(tiny_fmt, **change)  # type: ignore[arg-type]
    blocks = make_blocks(3)
    if foreign.nbytes != tiny_fmt.nbytes:
        blocks = [dataclasses.replace(b, kv=b.kv[: foreign.nbytes]) for b in blocks]
    decoded = decode_pack(tiny_fmt, encode_pack(foreign, blocks))
    assert decoded.blocks == []
    assert decoded.dropped == 3
    assert decoded.reason is not None and decoded.reason.startswith(f"foreign pack: {field} is")


def test_wrong_magic_drops_every_block(tiny_fmt: KVFormat, make_blocks: MakeBlocks) -> None:
    header, payload = _split(encode_pack(tiny_fmt, make_blocks(2)))
    assert header["magic"] == MAGIC
    header["magic"] = "not-kvferry"
    decoded = decode_pack(tiny_fmt, _join(header, payload))
    assert (decoded.blocks, decoded.dropped) == ([], 2)
    assert decoded.reason is not None and "magic" in decoded.reason


@pytest.mark.parametrize("field", ["hashes", "parents", "tokens", "checksums"])
def test_short_per_block_array_drops_the_pack(
    tiny_fmt: KVFormat, make_blocks: MakeBlocks, field: str
) -> None:
    header, payload = _split(encode_pack(tiny_fmt, make_blocks(3)))
    header[field] = header[field][:-1]
    decoded = decode_pack(tiny_fmt, _join(header, payload))
    assert (decoded.blocks, decoded.dropped, decoded.reason) == ([], 3, f"undecodable: {field}")


def test_changed_token_drops_only_that_block(tiny_fmt: KVFormat, make_blocks: MakeBlocks) -> None:
    blocks = make_blocks(3)
    header, payload = _split(encode_pack(tiny_fmt, blocks))
    tokens = bytearray(header["tokens"])
    tokens[16 * 8 + 3] ^= 0x10  # block 1, token 0
    header["tokens"] = bytes(tokens)
    decoded = decode_pack(tiny_fmt, _join(header, payload))
    assert decoded.blocks == [blocks[0], blocks[2]]
    assert (decoded.dropped, decoded.reason) == (1, "block 1: checksum mismatch")


def test_exact_blocks_are_views_into_the_received_buffer(tiny_fmt: KVFormat, make_blocks: MakeBlocks) -> None:
    data = encode_pack(tiny_fmt, make_blocks(2))
    decoded = decode_pack(tiny_fmt, data)
    for block in decoded.blocks:
        assert isinstance(block.kv, memoryview) and block.kv.obj is data and block.kv.readonly
    assert len({hash(b) for b in decoded.blocks}) == 2  # still hashable


def test_random_corruption_never_raises_nor_yields_a_changed_block(
    tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    blocks = make_blocks(3)
    data = encode_pack(tiny_fmt, blocks)
    rng = random.Random(1)
    for _ in range(300):
        bad = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            bad[rng.randrange(len(bad))] = rng.randrange(256)
        decoded = decode_pack(tiny_fmt, bytes(bad))
        assert all(block in blocks for block in decoded.blocks)
        assert len(decoded.blocks) + decoded.dropped >= 1


def test_encode_refuses_wrong_kv_length_or_token_count(tiny_fmt: KVFormat, make_blocks: MakeBlocks) -> None:
    block = make_blocks(1)[0]
    with pytest.raises(ValueError, match="bytes of KV"):
        encode_pack(tiny_fmt, [dataclasses.replace(block, kv=bytes(block.kv) + b"\x00")])
    with pytest.raises(ValueError, match="tokens"):
        encode_pack(tiny_fmt, [dataclasses.replace(block, token_ids=block.token_ids[:-1])])
