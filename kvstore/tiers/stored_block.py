"""A KV block outside the device pool (host memory, Redis), and the format its bytes are in."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvstore.chain import BlockHash

if TYPE_CHECKING:
    from kvstore.pool.kv_cache import KVLayout

ELEMENT_SIZES = {"float32": 4, "float16": 2, "bfloat16": 2}
# A block's KV bytes: bytes from the pool, or a read-only memoryview into a received Redis pack
# (no copy on the read path). Anything with the buffer protocol and len() in bytes.
KVBytes = bytes | memoryview


@dataclass(frozen=True, slots=True)
class KVFormat:
    """What a worker's pool holds; a block of another format is foreign and must be refused."""

    model_fingerprint: str
    dtype: str  # "float32" | "float16" | "bfloat16"
    shape: tuple[int, ...]  # one block: (layers, 2, block_size, kv_heads, head_dim)
    layout_version: int = 2  # of the pack format (kvstore/tiers/codec.py): 1 was one msgpack map

    def __post_init__(self) -> None:
        if not self.model_fingerprint:
            raise ValueError("model_fingerprint must not be empty")
        if self.dtype not in ELEMENT_SIZES:
            raise ValueError(f"dtype must be one of {sorted(ELEMENT_SIZES)}, got {self.dtype!r}")
        if not isinstance(self.shape, tuple) or len(self.shape) != 5 or self.shape[1] != 2:
            raise ValueError(f"shape must be (layers, 2, block_size, kv_heads, head_dim), got {self.shape}")
        if min(self.shape) < 1:
            raise ValueError(f"shape has an empty dimension: {self.shape}")

    @property
    def block_size(self) -> int:
        return self.shape[2]

    @property
    def nbytes(self) -> int:
        """Bytes of one block's KV."""
        return math.prod(self.shape) * ELEMENT_SIZES[self.dtype]

    @classmethod
    def from_layout(cls, layout: KVLayout, model_fingerprint: str) -> KVFormat:
        shape = (layout.num_layers, 2, layout.block_size, layout.num_kv_heads, layout.head_dim)
        return cls(model_fingerprint, str(layout.dtype).removeprefix("torch."), shape)


@dataclass(frozen=True, slots=True)
class StoredBlock:
    block_hash: BlockHash
    parent_hash: BlockHash
    token_ids: tuple[int, ...]
    kv: KVBytes  # exactly fmt.nbytes: tensor[:, :, b * bs : (b + 1) * bs] of the pool, contiguous
