"""PendingWrite: blocks queued for the Redis tier, as the engine thread hands them over.

Either a finished turn's blocks, copied into staging slots (workers/tiers/staging.py) by one cheap
copy on the engine thread, or blocks whose bytes exist already (a spilled block, which the warm
tier needed anyway). Packing, checksums and Redis I/O happen on the writer thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvstore.chain import BlockHash
from kvstore.tiers.stored_block import StoredBlock


@dataclass(frozen=True, slots=True)
class BlockMeta:
    block_hash: BlockHash
    parent_hash: BlockHash
    token_ids: tuple[int, ...]
    alone: bool = False  # in a pack of its own (a session turn's tail: RedisTier.put)


@dataclass(frozen=True, slots=True)
class PendingWrite:
    metas: tuple[BlockMeta, ...]
    slots: tuple[int, ...] = ()  # staging slots holding metas[i]'s KV; empty: ``ready`` holds it
    ready: tuple[StoredBlock, ...] = ()
    # A finished turn's write: the next turn (maybe on another worker) resumes from it, so a full
    # queue drops unpinned writes (spills) first.
    pinned: bool = False
    copied: Any = None  # a CUDA event the staging copy completes at; None on CPU
    nbytes: int = 0

    @classmethod
    def of_blocks(cls, blocks: Sequence[StoredBlock], pinned: bool = False) -> PendingWrite:
        metas = tuple(BlockMeta(b.block_hash, b.parent_hash, b.token_ids) for b in blocks)
        return cls(metas, (), tuple(blocks), pinned, None, sum(len(b.kv) for b in blocks))

    def __post_init__(self) -> None:
        held = len(self.slots) if self.slots else len(self.ready)
        if held != len(self.metas):
            raise ValueError(f"{len(self.metas)} block metas but KV for {held} blocks")

    @property
    def hashes(self) -> list[BlockHash]:
        return [m.block_hash for m in self.metas]

    @property
    def num_blocks(self) -> int:
        return len(self.metas)
