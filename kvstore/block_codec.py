"""The byte format of a pack of KV blocks, as stored in the cold tier.

A pack is one msgpack map: a header naming the format (magic, layout version, model, dtype, block
shape) and a list of blocks, each with a blake2b-128 checksum over its hash, parent, tokens and KV.
Decoding never raises on bad bytes: a foreign or unreadable pack drops every block, a block that
fails its own checks is dropped alone, and the caller recomputes what was dropped.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from kvstore.stored_block import KVFormat, StoredBlock

MAGIC = "kvferry-kv"


@dataclass(frozen=True, slots=True)
class DecodedPack:
    blocks: list[StoredBlock]  # the valid blocks, in pack order
    dropped: int
    reason: str | None  # None when every block was accepted; else why the first drop happened


def block_checksum(block_hash: bytes, parent_hash: bytes, token_ids: Sequence[int], kv: bytes) -> bytes:
    """blake2b (16-byte digest) over length-prefixed hash, parent, int64 tokens and KV."""
    h = hashlib.blake2b(digest_size=16)
    h.update(struct.pack("<4Q", len(block_hash), len(parent_hash), len(token_ids), len(kv)))
    h.update(block_hash)
    h.update(parent_hash)
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    h.update(kv)
    return h.digest()


def encode_pack(fmt: KVFormat, blocks: Sequence[StoredBlock]) -> bytes:
    entries = []
    for block in blocks:
        if len(block.kv) != fmt.nbytes:
            raise ValueError(f"block {block.block_hash.hex()}: {len(block.kv)} bytes of KV, not {fmt.nbytes}")
        if len(block.token_ids) != fmt.block_size:
            raise ValueError(
                f"block {block.block_hash.hex()}: {len(block.token_ids)} tokens, not {fmt.block_size}"
            )
        entries.append(
            {
                "hash": block.block_hash,
                "parent": block.parent_hash,
                "tokens": list(block.token_ids),
                "kv": block.kv,
                "checksum": block_checksum(block.block_hash, block.parent_hash, block.token_ids, block.kv),
            }
        )
    header: dict[str, Any] = {
        "magic": MAGIC,
        "layout_version": fmt.layout_version,
        "model_fingerprint": fmt.model_fingerprint,
        "dtype": fmt.dtype,
        "shape": list(fmt.shape),
        "blocks": entries,
    }
    packed: bytes = msgpack.packb(header, use_bin_type=True)
    return packed


def decode_pack(fmt: KVFormat, data: bytes) -> DecodedPack:
    try:
        pack = msgpack.unpackb(data, raw=False)
    except Exception as exc:  # msgpack raises several types (and "others") on malformed input
        return DecodedPack([], 1, f"undecodable: {type(exc).__name__}")
    if not isinstance(pack, dict):
        return DecodedPack([], 1, "not a pack: top level is not a map")
    entries = pack.get("blocks")
    count = len(entries) if isinstance(entries, list) else 1
    reason = _header_mismatch(fmt, pack)
    if reason is None and not isinstance(entries, list):
        reason = "no block list"
    if reason is not None:
        return DecodedPack([], count, reason)
    assert isinstance(entries, list)
    blocks: list[StoredBlock] = []
    first_reason: str | None = None
    for i, entry in enumerate(entries):
        block_or_reason = _decode_block(fmt, entry)
        if isinstance(block_or_reason, StoredBlock):
            blocks.append(block_or_reason)
        elif first_reason is None:
            first_reason = f"block {i}: {block_or_reason}"
    return DecodedPack(blocks, len(entries) - len(blocks), first_reason)


def _header_mismatch(fmt: KVFormat, pack: dict[Any, Any]) -> str | None:
    expected: list[tuple[str, object]] = [
        ("magic", MAGIC),
        ("layout_version", fmt.layout_version),
        ("model_fingerprint", fmt.model_fingerprint),
        ("dtype", fmt.dtype),
        ("shape", list(fmt.shape)),
    ]
    for field, want in expected:
        got = pack.get(field)
        if type(got) is not type(want) or got != want:
            return f"foreign pack: {field} is {repr(got)[:80]}, expected {want!r}"
    return None


def _decode_block(fmt: KVFormat, entry: object) -> StoredBlock | str:
    """The block, or why it is dropped."""
    if not isinstance(entry, dict):
        return "malformed entry"
    block_hash, parent, tokens, kv, checksum = (
        entry.get(k) for k in ("hash", "parent", "tokens", "kv", "checksum")
    )
    if not (
        isinstance(block_hash, bytes)
        and isinstance(parent, bytes)
        and isinstance(kv, bytes)
        and isinstance(checksum, bytes)
        and isinstance(tokens, list)
        and all(type(t) is int for t in tokens)
    ):
        return "malformed entry"
    if len(kv) != fmt.nbytes:
        return f"{len(kv)} bytes of KV, expected {fmt.nbytes}"
    if len(tokens) != fmt.block_size:
        return f"{len(tokens)} tokens, expected {fmt.block_size}"
    try:
        ok = block_checksum(block_hash, parent, tokens, kv) == checksum
    except struct.error:  # a token id outside int64
        return "token id out of range"
    if not ok:
        return "checksum mismatch"
    return StoredBlock(block_hash, parent, tuple(tokens), kv)
