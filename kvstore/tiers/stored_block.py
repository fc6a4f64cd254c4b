"""A KV block outside the device pool (host memory, Redis): its hash, parent, tokens and bytes."""

from __future__ import annotations

from dataclasses import dataclass

from kvstore.chain import BlockHash
from kvstore.layout import KVBytes


@dataclass(frozen=True, slots=True)
class StoredBlock:
    block_hash: BlockHash
    parent_hash: BlockHash
    token_ids: tuple[int, ...]
    kv: KVBytes  # exactly fmt.nbytes: tensor[:, :, b * bs : (b + 1) * bs] of the pool, contiguous
