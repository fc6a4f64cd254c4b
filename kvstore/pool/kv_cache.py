"""KVCache: the one pool tensor per worker that holds every block's K and V."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from kvstore.layout import KVBytes, KVLayout, bytes_view
from kvstore.pool import int8_rows

# A load of this many bytes or more is copied by two threads on a CPU pool: numpy's copies release
# the GIL, and one thread's strided copy leaves memory bandwidth unused (docs/benchmarks.md).
_SPLIT_BYTES = 8 * 1024**2

BlockWriter = Callable[[torch.Tensor, int, Sequence[tuple[int, KVBytes]]], None]


class KVCache:
    """Storage only: block bookkeeping lives in BlockPool, which never touches this tensor.

    Layout [layers, 2 (k, v), slots, kv_heads, row] with slot = block_id * block_size + offset,
    so one layer's keys are a flat slot array that a slot mapping can write and a block table can
    gather, and one block of one layer is a contiguous run of block_size slots. row = head_dim, or
    for an int8 pool head_dim values and their scale (int8_rows.py): read them through `dense`.
    """

    def __init__(self, layout: KVLayout, num_blocks: int, device: torch.device | str) -> None:
        if num_blocks < 1:
            raise ValueError(
                f"the cache budget holds no block: one block needs {layout.bytes_per_block} bytes"
            )
        self.layout = layout
        self.num_blocks = num_blocks
        self.num_slots = num_blocks * layout.block_size
        self._pinned: torch.Tensor | None = None  # write_block's staging buffer, GPU pools only
        self._helper: ThreadPoolExecutor | None = None  # write_blocks' second copier, CPU pools only
        self._helper_lock = threading.Lock()
        # A faster copier for write_blocks on a CPU pool, plugged in by the engine where its
        # kernels build (workers/engine/kernels/block_writer.py): (pool tensor, block size, loads).
        self.block_writer: BlockWriter | None = None
        self.tensor = torch.zeros(
            layout.num_layers,
            2,
            self.num_slots,
            layout.num_kv_heads,
            layout.row,
            dtype=layout.dtype,
            device=device,
        )

    @classmethod
    def from_budget(cls, layout: KVLayout, budget_bytes: int, device: torch.device | str) -> KVCache:
        return cls(layout, layout.blocks_for_budget(budget_bytes), device)

    @property
    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()

    def keys(self, layer: int) -> torch.Tensor:
        return self.tensor[layer, 0]  # [slots, kv_heads, row]

    def values(self, layer: int) -> torch.Tensor:
        return self.tensor[layer, 1]  # [slots, kv_heads, row]

    @property
    def quantized(self) -> bool:
        """An int8 pool: rows carry their scales; read them through `dense`."""
        return self.tensor.dtype == torch.int8

    def dense(self, rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """K or V read out of this pool ([..., row]) as [..., head_dim] of `dtype`."""
        return int8_rows.dequantize(rows, dtype) if self.quantized else rows.to(dtype)

    def write(self, layer: int, slots: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        """key, value: [tokens, kv_heads, head_dim]; slots: [tokens] (int64, on the cache's device).
        Rounded to the pool's dtype where it is narrower (a bf16 pool under fp32 activations), or
        quantised with a scale per token and head (an int8 pool)."""
        store = int8_rows.quantize if self.quantized else (lambda x: x.to(self.tensor.dtype))
        self.tensor[layer, 0].index_copy_(0, slots, store(key))
        self.tensor[layer, 1].index_copy_(0, slots, store(value))

    # -- one block's bytes, for the warm and cold tiers ------------------------------------------

    def _block_view(self, block_id: int) -> torch.Tensor:
        bs = self.layout.block_size
        return self.tensor[:, :, block_id * bs : (block_id + 1) * bs]  # [layers, 2, bs, kv_heads, row]

    def by_block(self) -> torch.Tensor:
        """The pool as [blocks, layers, 2, block_size, kv_heads, head_dim]: a view (no copy), so
        that by_block()[b] is block b, with read_block(b)'s layout once made contiguous."""
        L, _, _, heads, dim = self.tensor.shape
        shape = (L, 2, self.num_blocks, self.layout.block_size, heads, dim)
        return self.tensor.view(shape).permute(2, 0, 1, 3, 4, 5)

    def copy_block(self, src: int, dst: int) -> None:
        """Block dst's K and V become block src's (a partial block forked copy-on-write)."""
        self._block_view(dst).copy_(self._block_view(src))

    def read_block(self, block_id: int) -> bytes:
        """A copy of one block's K and V as raw bytes (layout of `_block_view`, native dtype)."""
        view = self._block_view(block_id).contiguous()
        return bytes(view.view(torch.uint8).cpu().numpy().tobytes())

    def write_block(self, block_id: int, data: KVBytes) -> None:
        """Overwrite one block's K and V from bytes made by read_block (any worker, same layout).

        ``data`` may be a read-only view into a received Redis pack: it is read in place, one copy
        into the pool (through a staging buffer in pinned host memory when the pool is on a GPU)."""
        target = self._block_view(block_id)
        expected = target.numel() * target.element_size()
        if len(data) != expected:
            raise ValueError(f"block bytes: got {len(data)}, expected {expected}")
        if target.device.type == "cpu":
            # numpy, not torch's copy_: torch's intra-op thread team copies far slower on busy
            # cores (docs/benchmarks.md)
            dst = target.view(torch.uint8).numpy()  # [layers, 2, bs, kv_heads, head_dim * elem], strided
            np.copyto(dst, np.frombuffer(data, dtype=np.uint8).reshape(dst.shape))
            return
        staged = self._staging(expected).copy_(bytes_view(data))
        target.copy_(staged.view(self.layout.dtype).view(target.shape), non_blocking=True)
        torch.cuda.current_stream(target.device).synchronize()  # the staging buffer is reused next

    def write_blocks(self, loads: Sequence[tuple[int, KVBytes]]) -> None:
        """write_block for each (block id, bytes); a large load on a CPU pool is split between this
        thread and a helper (every copy is done when this returns, or its error raised here)."""
        if self.block_writer is not None and self.tensor.device.type == "cpu":
            self.block_writer(self.tensor, self.layout.block_size, loads)
            return
        total = sum(len(data) for _, data in loads)
        if self.tensor.device.type != "cpu" or total < _SPLIT_BYTES:
            for block_id, data in loads:
                self.write_block(block_id, data)
            return
        helper = self._start_helper()
        theirs = helper.submit(self._write_each, loads[1::2])
        try:
            self._write_each(loads[0::2])
        finally:
            theirs.result()

    def _write_each(self, loads: Sequence[tuple[int, KVBytes]]) -> None:
        for block_id, data in loads:
            self.write_block(block_id, data)

    def _start_helper(self) -> ThreadPoolExecutor:
        with self._helper_lock:
            if self._helper is None:
                self._helper = ThreadPoolExecutor(1, thread_name_prefix="kv-pool-copy")
            return self._helper

    def _staging(self, nbytes: int) -> torch.Tensor:
        if self._pinned is None or self._pinned.numel() != nbytes:
            self._pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        return self._pinned
