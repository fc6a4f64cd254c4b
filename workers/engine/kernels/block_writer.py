"""The CPU pool's block loader (csrc/block_copy.cpp, built by build.py): the blocks a step
loads from the warm tier or from Redis packs, copied into their slots with streaming stores.

KVCache.write_blocks copies with numpy otherwise; the streaming stores skip reading each
destination line first, so a load moves less memory than numpy's copies (docs/benchmarks.md). The
engine plugs it into its CPU pool (KVCache.block_writer) where the library builds; elsewhere
KVCache.write_blocks keeps its own copies.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from kvstore.layout import KVBytes
from workers.engine.kernels import build


def available() -> bool:
    return build.built() and hasattr(torch.ops.kvferry, "write_blocks")


def write_blocks(pool: torch.Tensor, block_size: int, loads: Sequence[tuple[int, KVBytes]]) -> None:
    """pool[:, :, slots of block b] = data, for each (b, data): data holds one block in
    KVCache.read_block's layout (bytes or any buffer, read in place), each b once. Checks every
    length and that no block comes twice before anything is written; the kernel checks the pool
    and every block id."""
    per_block = pool[:, :, :block_size].numel() * pool.element_size()
    arrays = [np.frombuffer(data, dtype=np.uint8) for _, data in loads]  # views: no copy
    for (block_id, _), array in zip(loads, arrays, strict=True):
        if array.nbytes != per_block:
            raise ValueError(f"block {block_id}: got {array.nbytes} bytes, expected {per_block}")
    ids = [block_id for block_id, _ in loads]
    if len(set(ids)) != len(ids):  # threads copy a block's runs apart: two writers would mix
        raise ValueError(f"a block loaded twice in one call: {sorted(ids)}")
    sources = torch.tensor([a.ctypes.data for a in arrays], dtype=torch.long)  # `arrays` keeps them alive
    torch.ops.kvferry.write_blocks(pool, torch.tensor(ids, dtype=torch.long), sources, block_size)
