"""Stable, chained hashes of full KV blocks.

The same prefix must hash the same in every worker and after every restart, so the hashes are
sha256 over explicit byte encodings, never Python's ``hash()``.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

BlockHash = bytes  # 32-byte sha256 digest

_DOMAIN_TAG = b"kvferry/block/v1"
_KEY_TAGS: dict[type, bytes] = {str: b"s", int: b"i", bytes: b"b"}


def _encode_key(key: str | int | bytes) -> bytes:
    # Type tag + length prefix, so ("ab", "c") and ("a", "bc"), or 1 and "1", never collide.
    kind = type(key)
    if kind not in _KEY_TAGS:
        raise TypeError(f"extra key must be str, int or bytes, got {kind.__name__}")
    if isinstance(key, str):
        raw = key.encode("utf-8")
    elif isinstance(key, int):
        raw = str(key).encode("ascii")
    else:
        raw = key
    return _KEY_TAGS[kind] + struct.pack("<Q", len(raw)) + raw


def root_hash(extra_keys: Sequence[str | int | bytes]) -> BlockHash:
    """Hash of the domain tag and the extra keys (model id, tenant salt): the first block's parent."""
    h = hashlib.sha256(_DOMAIN_TAG)
    h.update(struct.pack("<Q", len(extra_keys)))
    for key in extra_keys:
        h.update(_encode_key(key))
    return h.digest()


def hash_block(parent: BlockHash, token_ids: Sequence[int]) -> BlockHash:
    """sha256(parent || token ids as a little-endian int64 array)."""
    h = hashlib.sha256(parent)
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return h.digest()


def hash_blocks(
    token_ids: Sequence[int],
    block_size: int,
    extra_keys: Sequence[str | int | bytes],
    parent: BlockHash | None = None,
) -> list[BlockHash]:
    """Chained hashes of the full blocks of ``token_ids``; a trailing partial block is not hashed.

    ``parent`` None starts the chain at ``root_hash(extra_keys)``; otherwise the chain continues
    from ``parent`` (which already carries the extra keys) and ``extra_keys`` is not used.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    prev = root_hash(extra_keys) if parent is None else parent
    hashes: list[BlockHash] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        prev = hash_block(prev, token_ids[start : start + block_size])
        hashes.append(prev)
    return hashes


def chain_root(fingerprint: str, salt: str) -> BlockHash:
    """The parent of a sequence's first block: the model's weights and the tenant's salt, so the
    same tokens never hit across models or tenants. Every chain kvferry keeps starts here."""
    return root_hash((fingerprint, salt))


def chain(
    token_ids: Sequence[int],
    block_size: int,
    fingerprint: str,
    salt: str,
    known: Sequence[BlockHash] = (),
) -> list[BlockHash]:
    """The chained hashes of every full block of ``token_ids`` under (fingerprint, salt).

    ``known``: the hashes of the first blocks, already computed (by the engine, block by block as
    they filled); only the blocks after them are hashed here."""
    full = len(token_ids) // block_size
    done = list(known[:full])
    parent = done[-1] if done else chain_root(fingerprint, salt)
    start = len(done) * block_size
    return [*done, *hash_blocks(token_ids[start : full * block_size], block_size, (), parent=parent)]
