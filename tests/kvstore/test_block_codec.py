"""Pack encoding: exact round trips; every kind of bad bytes drops blocks and never raises."""

from __future__ import annotations

import dataclasses
import random

import msgpack
import pytest
import torch

from kvstore.block_codec import MAGIC, block_checksum, decode_pack, encode_pack
from kvstore.kv_cache import KVCache, KVLayout
from kvstore.stored_block import KVFormat, StoredBlock
from tests.kvstore.conftest import TINY_LAYOUT, MakeBlocks


def test_format_from_layout_matches_the_pool(tiny_fmt: KVFormat) -> None:
    assert tiny_fmt == KVFormat("tiny-test", "float32", (2, 2, 16, 2, 16), 1)
    assert tiny_fmt.nbytes == TINY_LAYOUT.bytes_per_block == 8192
    assert tiny_fmt.block_size == 16
    smollm2 = KVLayout(num_layers=30, num_kv_heads=3, head_dim=64, block_size=16, dtype=torch.float32)
    assert KVFormat.from_layout(smollm2, "m").nbytes == 737_280
    bf16 = dataclasses.replace(TINY_LAYOUT, dtype=torch.bfloat16)
    assert KVFormat.from_layout(bf16, "m").dtype == "bfloat16"


@pytest.mark.parametrize(
    ("dtype", "shape"),
    [("int8", (2, 2, 16, 2, 16)), ("float32", (2, 2, 16, 2)), ("float32", (2, 3, 16, 2, 16))],
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
        assert decoded.blocks == [] and decoded.dropped == 1
        assert decoded.reason is not None and decoded.reason.startswith("undecodable")


@pytest.mark.parametrize(
    "garbage",
    [
        b"",
        b"\x00",
        b"\xc1",  # never used in msgpack
        bytes(range(256)) * 8,
        msgpack.packb([1, 2, 3]),
        msgpack.packb(7),
        msgpack.packb({"magic": "kvferry-kv"}),  # no format fields
        msgpack.packb({"blocks": "x" * 5}),
        encode_pack(KVFormat("tiny-test", "float32", (2, 2, 16, 2, 16)), []) + b"extra",
    ],
)
def test_garbage_drops_everything_without_raising(tiny_fmt: KVFormat, garbage: bytes) -> None:
    decoded = decode_pack(tiny_fmt, garbage)
    assert decoded.blocks == []
    assert decoded.dropped == 1
    assert decoded.reason is not None


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"model_fingerprint": "other-model"}, "model_fingerprint"),
        ({"dtype": "float16"}, "dtype"),
        ({"shape": (2, 2, 16, 4, 8)}, "shape"),  # same byte count, another head split
        ({"layout_version": 2}, "layout_version"),
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
    pack = msgpack.unpackb(encode_pack(tiny_fmt, make_blocks(2)))
    assert pack["magic"] == MAGIC
    pack["magic"] = "not-kvferry"
    decoded = decode_pack(tiny_fmt, msgpack.packb(pack))
    assert (decoded.blocks, decoded.dropped) == ([], 2)
    assert decoded.reason is not None and "magic" in decoded.reason


def _repack(fmt: KVFormat, blocks: list[StoredBlock], i: int, **entry: object) -> bytes:
    """The pack of ``blocks`` with entry ``i`` changed and its checksum recomputed to match, unless
    ``entry`` sets one."""
    pack = msgpack.unpackb(encode_pack(fmt, blocks))
    e = pack["blocks"][i]
    e.update(entry)
    if "checksum" not in entry:
        e["checksum"] = block_checksum(e["hash"], e["parent"], e["tokens"], e["kv"])
    return bytes(msgpack.packb(pack))


def test_block_with_wrong_kv_length_or_token_count_is_dropped_alone(
    tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    blocks = make_blocks(3)
    short_kv = decode_pack(tiny_fmt, _repack(tiny_fmt, blocks, 1, kv=blocks[1].kv[:-4]))
    assert short_kv.blocks == [blocks[0], blocks[2]]
    assert short_kv.reason == "block 1: 8188 bytes of KV, expected 8192"
    few_tokens = decode_pack(tiny_fmt, _repack(tiny_fmt, blocks, 0, tokens=list(blocks[0].token_ids[:15])))
    assert few_tokens.blocks == blocks[1:]
    assert few_tokens.reason == "block 0: 15 tokens, expected 16"
    huge_token = decode_pack(tiny_fmt, _repack(tiny_fmt, blocks, 2, tokens=[2**64 - 1] * 16, checksum=b""))
    assert huge_token.blocks == blocks[:2]
    assert huge_token.reason == "block 2: token id out of range"


def test_malformed_entry_is_dropped_alone(tiny_fmt: KVFormat, make_blocks: MakeBlocks) -> None:
    blocks = make_blocks(3)
    pack = msgpack.unpackb(encode_pack(tiny_fmt, blocks))
    pack["blocks"][0] = "not a block"
    del pack["blocks"][1]["parent"]
    decoded = decode_pack(tiny_fmt, msgpack.packb(pack))
    assert decoded.blocks == [blocks[2]]
    assert (decoded.dropped, decoded.reason) == (2, "block 0: malformed entry")


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
        encode_pack(tiny_fmt, [dataclasses.replace(block, kv=block.kv + b"\x00")])
    with pytest.raises(ValueError, match="tokens"):
        encode_pack(tiny_fmt, [dataclasses.replace(block, token_ids=block.token_ids[:-1])])
