"""Events a block pool emits so others (router, cold tier) never read its dicts."""

from __future__ import annotations

from dataclasses import dataclass

from kvstore.chain import BlockHash


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hash: BlockHash
    parent_hash: BlockHash
    token_ids: tuple[int, ...]
    block_id: int


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hash: BlockHash
    block_id: int


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


BlockEvent = BlockStored | BlockRemoved | AllBlocksCleared
