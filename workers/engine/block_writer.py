"""The CPU pool's block loader (csrc/block_copy.cpp, built by cpu_kernels.py): the blocks a step
loads from the warm tier or from Redis packs, copied into their slots with streaming stores.

KVCache.write_blocks copies with numpy otherwise: on 2 cores, 128 blocks of SmolLM2 (94 MB) took
8-9 ms over two threads, and take 4-5 ms here (the stores skip reading each destination line
first). The engine plugs it into its pool (KVCache.block_writer) where the library builds; GPU
pools and machines without a compiler keep the numpy path.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch

from kvstore.stored_block import KVBytes
from workers.engine import cpu_kernels

log = logging.getLogger(__name__)


def available() -> bool:
    return cpu_kernels.built() and hasattr(torch.ops.kvferry, "write_blocks")


def write_blocks(pool: torch.Tensor, block_size: int, loads: Sequence[tuple[int, KVBytes]]) -> None:
    """pool[:, :, slots of block b] = data, for each (b, data): data holds one block in
    KVCache.read_block's layout (bytes or any buffer, read in place). Checks every length before
    anything is written; the kernel checks the pool and every block id."""
    per_block = pool[:, :, :block_size].numel() * pool.element_size()
    arrays = [np.frombuffer(data, dtype=np.uint8) for _, data in loads]  # views: no copy
    for (block_id, _), array in zip(loads, arrays, strict=True):
        if array.nbytes != per_block:
            raise ValueError(f"block {block_id}: got {array.nbytes} bytes, expected {per_block}")
    ids = torch.tensor([block_id for block_id, _ in loads], dtype=torch.long)
    sources = torch.tensor([a.ctypes.data for a in arrays], dtype=torch.long)  # `arrays` keeps them alive
    torch.ops.kvferry.write_blocks(pool, ids, sources, block_size)
