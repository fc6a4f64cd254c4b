"""StagingArena: host memory, in block-sized slots, that a finished turn's KV is copied into on the
engine thread, so the writer thread can pack it while the pool reuses the blocks' slots.

Allocated once and reused: a fresh 60 MB buffer per turn would cost the engine thread its page
faults, far more than the copy into memory touched before (docs/benchmarks.md). Not thread-safe: the
writer guards it with its lock. Pinned on a GPU pool, so the device-to-host copy is asynchronous.
"""

from __future__ import annotations

import torch


class StagingArena:
    def __init__(
        self, block_shape: tuple[int, ...], dtype: torch.dtype, capacity_blocks: int, pinned: bool
    ) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"the staging arena must hold at least one block, got {capacity_blocks}")
        # [slots, layers, 2, block_size, kv_heads, head_dim]
        self.tensor = torch.empty((capacity_blocks, *block_shape), dtype=dtype, pin_memory=pinned)
        self.capacity_blocks = capacity_blocks
        self._free = list(range(capacity_blocks - 1, -1, -1))  # popped from the end: slot 0 first
        self.touched = False

    def touch(self) -> None:
        """Fault every page in now (the writer thread does it at start, off the engine thread)."""
        self.tensor.zero_()
        self.touched = True

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def block_nbytes(self) -> int:
        return self.tensor[0].numel() * self.tensor.element_size()

    def take(self, n: int) -> list[int] | None:
        if n > len(self._free):
            return None
        taken = self._free[len(self._free) - n :]
        del self._free[len(self._free) - n :]
        return taken[::-1]

    def give(self, slots: list[int]) -> None:
        self._free.extend(slots)

    def row(self, slot: int) -> memoryview:
        """One slot's bytes, zero-copy: valid until the slot is given back."""
        return self.tensor[slot].view(-1).view(torch.uint8).numpy().data
