"""The byte format of a pack of KV blocks, as stored in the cold tier (layout version 2).

    [0:4)     PACK_MAGIC, b"KVF2"
    [4:8)     header length H, uint32 little-endian
    [8:8+H)   msgpack map: magic, layout version, model fingerprint, pool dtype, block shape, tier
              dtype, block count n, stride (bytes per stored block), and per block, as compact
              arrays: hashes (n x 32 bytes), parents (n x 32), tokens (n x block_size int64 LE),
              checksums (n x 16, xxh3-128)
    [8+H:)    the payload: n stored blocks back to back, ``stride`` bytes each (kvstore/quant.py)

A block's checksum covers its hash, parent, token ids and stored bytes. Decoding reads straight from
the received buffer: the blocks of an exact pack are memoryviews into it (no copy), checked where
they lie. Decoding never raises on bad bytes: a foreign (layout 1 included) or unreadable pack drops
every block, a block that fails its checksum is dropped alone, and the caller recomputes them.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import xxhash

from kvstore.layout import KVFormat
from kvstore.tiers import quant
from kvstore.tiers.quant import TierDtype
from kvstore.tiers.stored_block import StoredBlock

MAGIC = "kvferry-kv"
PACK_MAGIC = b"KVF2"
HASH_LEN = 32
CHECKSUM_LEN = 16
_PREFIX = struct.Struct("<4sI")
_MAX_HEADER = 16 * 1024**2


@dataclass(frozen=True, slots=True)
class DecodedPack:
    blocks: list[StoredBlock]  # the valid blocks, in pack order
    dropped: int
    reason: str | None  # None when every block was accepted; else why the first drop happened


def block_checksum(block_hash: object, parent_hash: object, tokens: object, stored: object) -> bytes:
    """xxh3-128 over hash, parent, int64 token ids and stored bytes (sizes fixed by the header)."""
    h = xxhash.xxh3_128()
    for part in (block_hash, parent_hash, tokens, stored):
        h.update(part)  # type: ignore[arg-type]  # any buffer: bytes, memoryview, numpy rows
    return h.digest()


def encode_pack(fmt: KVFormat, blocks: Sequence[StoredBlock], tier_dtype: TierDtype = "exact") -> bytes:
    for block in blocks:
        if len(block.kv) != fmt.nbytes:
            raise ValueError(f"block {block.block_hash.hex()}: {len(block.kv)} bytes of KV, not {fmt.nbytes}")
        if len(block.token_ids) != fmt.block_size:
            raise ValueError(
                f"block {block.block_hash.hex()}: {len(block.token_ids)} tokens, not {fmt.block_size}"
            )
        if len(block.block_hash) != HASH_LEN or len(block.parent_hash) != HASH_LEN:
            raise ValueError(f"block {block.block_hash.hex()}: hashes must be {HASH_LEN} bytes")
    try:
        tokens = np.array([b.token_ids for b in blocks], dtype="<i8").reshape(len(blocks), fmt.block_size)
    except OverflowError as exc:
        raise ValueError("a token id is outside int64") from exc
    stored = quant.encode(fmt, tier_dtype, [b.kv for b in blocks])
    checksums = b"".join(
        block_checksum(b.block_hash, b.parent_hash, tokens[i], stored[i]) for i, b in enumerate(blocks)
    )
    header: bytes = msgpack.packb(
        {
            "magic": MAGIC,
            "layout_version": fmt.layout_version,
            "model_fingerprint": fmt.model_fingerprint,
            "dtype": fmt.dtype,
            "shape": list(fmt.shape),
            "tier_dtype": tier_dtype,
            "count": len(blocks),
            "stride": quant.encoded_nbytes(fmt, tier_dtype),
            "hashes": b"".join(b.block_hash for b in blocks),
            "parents": b"".join(b.parent_hash for b in blocks),
            "tokens": tokens.tobytes(),
            "checksums": checksums,
        },
        use_bin_type=True,
    )
    return b"".join([_PREFIX.pack(PACK_MAGIC, len(header)), header, *stored])  # type: ignore[list-item]


def decode_pack(fmt: KVFormat, data: bytes | memoryview, tier_dtype: TierDtype = "exact") -> DecodedPack:
    view = memoryview(data).cast("B")
    if len(view) < _PREFIX.size or bytes(view[:4]) != PACK_MAGIC:
        return DecodedPack([], 1, "foreign pack: not a layout 2 pack (magic)")
    (_, size) = _PREFIX.unpack_from(view)
    if size > min(_MAX_HEADER, len(view) - _PREFIX.size):
        return DecodedPack([], 1, "undecodable: header length")
    try:
        header = msgpack.unpackb(view[_PREFIX.size : _PREFIX.size + size], raw=False)
    except Exception as exc:  # msgpack raises several types (and "others") on malformed input
        return DecodedPack([], 1, f"undecodable: {type(exc).__name__}")
    if not isinstance(header, dict):
        return DecodedPack([], 1, "undecodable: header is not a map")
    count = header.get("count")
    dropped = count if type(count) is int and 0 < count < 1 << 20 else 1  # a whole pack: >= 1
    reason = _header_mismatch(fmt, tier_dtype, header)
    if reason is not None:
        return DecodedPack([], dropped, reason)
    assert isinstance(count, int)
    stride = quant.encoded_nbytes(fmt, tier_dtype)
    payload = view[_PREFIX.size + size :]
    bs = fmt.block_size
    sizes = {"hashes": HASH_LEN, "parents": HASH_LEN, "tokens": 8 * bs, "checksums": CHECKSUM_LEN}
    for field, each in sizes.items():
        value = header.get(field)
        if not isinstance(value, bytes) or len(value) != count * each:
            return DecodedPack([], dropped, f"undecodable: {field}")
    if len(payload) != count * stride:
        return DecodedPack(
            [], dropped, f"undecodable: payload of {len(payload)} bytes, expected {count * stride}"
        )
    hashes, parents, sums = header["hashes"], header["parents"], header["checksums"]
    tokens = np.frombuffer(header["tokens"], dtype="<i8").reshape(count, bs)
    ok = [
        block_checksum(
            hashes[i * HASH_LEN : (i + 1) * HASH_LEN],
            parents[i * HASH_LEN : (i + 1) * HASH_LEN],
            tokens[i],
            payload[i * stride : (i + 1) * stride],
        )
        == sums[i * CHECKSUM_LEN : (i + 1) * CHECKSUM_LEN]
        for i in range(count)
    ]
    kvs = _decode_valid(fmt, tier_dtype, payload, ok, stride)
    blocks = [
        StoredBlock(
            hashes[i * HASH_LEN : (i + 1) * HASH_LEN],
            parents[i * HASH_LEN : (i + 1) * HASH_LEN],
            tuple(tokens[i].tolist()),
            kvs[i],
        )
        for i in range(count)
        if ok[i]
    ]
    first_bad = next((i for i in range(count) if not ok[i]), None)
    return DecodedPack(
        blocks, count - len(blocks), None if first_bad is None else f"block {first_bad}: checksum mismatch"
    )


def _decode_valid(
    fmt: KVFormat, tier_dtype: TierDtype, payload: memoryview, ok: list[bool], stride: int
) -> dict[int, memoryview]:
    """Pool bytes of the blocks that passed their checksum: the whole payload decoded in one pass
    when all did (the usual case), else block by block."""
    if all(ok):
        return dict(enumerate(quant.decode(fmt, tier_dtype, payload, len(ok))))
    return {
        i: quant.decode(fmt, tier_dtype, payload[i * stride : (i + 1) * stride], 1)[0]
        for i in range(len(ok))
        if ok[i]
    }


def _header_mismatch(fmt: KVFormat, tier_dtype: TierDtype, header: dict[Any, Any]) -> str | None:
    expected: list[tuple[str, object]] = [
        ("magic", MAGIC),
        ("layout_version", fmt.layout_version),
        ("model_fingerprint", fmt.model_fingerprint),
        ("dtype", fmt.dtype),
        ("shape", list(fmt.shape)),
        ("tier_dtype", tier_dtype),
        ("stride", quant.encoded_nbytes(fmt, tier_dtype)),
    ]
    for field, want in expected:
        got = header.get(field)
        if type(got) is not type(want) or got != want:
            return f"foreign pack: {field} is {repr(got)[:80]}, expected {want!r}"
    if type(header.get("count")) is not int or not 0 <= header["count"] < 1 << 20:
        return "undecodable: count"
    return None
