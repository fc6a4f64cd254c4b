"""The byte layout of a KV block: its shape in a worker's pool (KVLayout), the format its bytes
carry outside the pool (KVFormat), and a zero-copy view of those bytes. Below the pool and the
tiers alike: both speak it, neither owns it."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import cast

import torch

ELEMENT_SIZES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}
# An int8 pool's head row: head_dim int8 values, then that row's fp32 scale (kvstore/pool/int8_rows.py).
INT8_SCALE_BYTES = 4
# A block's KV bytes: bytes from the pool, or a read-only memoryview into a received Redis pack
# (no copy on the read path). Anything with the buffer protocol and len() in bytes.
KVBytes = bytes | memoryview


@dataclass(frozen=True, slots=True)
class KVLayout:
    """The shape of one block, identical in every worker serving the same model."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype

    @property
    def row(self) -> int:
        """The pool's last dimension, in elements of its dtype: head_dim, or for an int8 pool
        head_dim values then the row's fp32 scale (4 int8 elements)."""
        return self.head_dim + (INT8_SCALE_BYTES if self.dtype == torch.int8 else 0)

    @property
    def bytes_per_token(self) -> int:
        # K and V, every layer: 2 x layers x kv heads x row x element size
        elem = self.dtype.itemsize  # no tensor made for it: engine stats read it after steps
        return 2 * self.num_layers * self.num_kv_heads * self.row * elem

    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_token * self.block_size

    def blocks_for_budget(self, budget_bytes: int) -> int:
        return budget_bytes // self.bytes_per_block


@dataclass(frozen=True, slots=True)
class KVFormat:
    """What a worker's pool holds; a block of another format is foreign and must be refused."""

    model_fingerprint: str
    dtype: str  # "float32" | "float16" | "bfloat16" | "int8"
    # one block: (layers, 2, block_size, kv_heads, row), row = head_dim (int8: head_dim + 4, the
    # row's fp32 scale after its values: a pack of an int8 pool carries its scales)
    shape: tuple[int, ...]
    layout_version: int = 2  # of the pack format (kvstore/tiers/codec.py): 1 was one msgpack map

    def __post_init__(self) -> None:
        if not self.model_fingerprint:
            raise ValueError("model_fingerprint must not be empty")
        if self.dtype not in ELEMENT_SIZES:
            raise ValueError(f"dtype must be one of {sorted(ELEMENT_SIZES)}, got {self.dtype!r}")
        if not isinstance(self.shape, tuple) or len(self.shape) != 5 or self.shape[1] != 2:
            raise ValueError(f"shape must be (layers, 2, block_size, kv_heads, row), got {self.shape}")
        if min(self.shape) < 1:
            raise ValueError(f"shape has an empty dimension: {self.shape}")

    @property
    def block_size(self) -> int:
        return self.shape[2]

    @property
    def torch_dtype(self) -> torch.dtype:
        dtype: torch.dtype = getattr(torch, self.dtype)
        return dtype

    @property
    def nbytes(self) -> int:
        """Bytes of one block's KV."""
        return math.prod(self.shape) * ELEMENT_SIZES[self.dtype]

    @classmethod
    def from_layout(cls, layout: KVLayout, model_fingerprint: str) -> KVFormat:
        shape = (layout.num_layers, 2, layout.block_size, layout.num_kv_heads, layout.row)
        return cls(model_fingerprint, str(layout.dtype).removeprefix("torch."), shape)


def bytes_view(data: object) -> torch.Tensor:
    """A uint8 tensor over any bytes-like object, without a copy. The buffer may be read-only (a
    Redis reply): torch warns about that, but nothing here ever writes through the view."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(cast("bytes", data), dtype=torch.uint8)
