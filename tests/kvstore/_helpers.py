"""Shared helpers for the kvstore tests."""

from __future__ import annotations

from collections.abc import Sequence

from kvstore.chain import BlockHash, hash_blocks, root_hash
from kvstore.pool.block import Block
from kvstore.pool.block_pool import BlockPool

EXTRA_KEYS = ("test-model", "tenant-a")


def commit(pool: BlockPool, blocks: Sequence[Block], token_ids: Sequence[int]) -> list[BlockHash]:
    """Commit every full block of a sequence the way the engine does; return the hash chain."""
    bs = pool.block_size
    hashes = hash_blocks(token_ids, bs, EXTRA_KEYS)
    parent = root_hash(EXTRA_KEYS)
    for i, (block, block_hash) in enumerate(zip(blocks, hashes, strict=False)):
        pool.cache_full_block(block, parent, block_hash, token_ids[i * bs : (i + 1) * bs])
        parent = block_hash
    return hashes


def ids(blocks: Sequence[Block] | None) -> list[int]:
    assert blocks is not None
    return [b.block_id for b in blocks]
