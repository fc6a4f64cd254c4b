"""An int8 pool's rows: each token's K (or V) of one KV head is head_dim int8 values followed by
its own fp32 scale (4 bytes), symmetric: value = int8 * scale, scale = absmax / 127.

The scale is per slot and head, not per block: a block fills a token at a time, and a per-block
scale would have to requantise the tokens already written whenever a larger value arrives (their
bytes would then depend on what came after them, and a block's prefix shared before that would
differ from the same prefix read later). A slot's scale is fixed when the slot is written, so a
slot's bytes are a function of its own K/V only. It costs 4 bytes beside D int8 values (6 % at
D = 64) and keeps each head row one contiguous run, so every byte-level path (block copy, the
warm tier, the Redis packs, the streamed loader) carries the scales with the values unchanged.
csrc/kv_rows.cpp writes and reads the same bytes with the same arithmetic (round half to even of
x / scale, clamped to +-127)."""

from __future__ import annotations

import torch

from kvstore.layout import INT8_SCALE_BYTES


def quantize(x: torch.Tensor) -> torch.Tensor:
    """x [..., D] float -> [..., D + 4] int8: the values, then the fp32 scale's bytes."""
    x = x.float()
    absmax = x.abs().amax(dim=-1, keepdim=True)  # [..., 1]
    scale = torch.where(absmax > 0, absmax / 127.0, torch.ones_like(absmax))
    q = torch.round(x / scale).clamp_(-127, 127).to(torch.int8)
    return torch.cat([q, scale.view(torch.int8)], dim=-1)


def dequantize(rows: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """rows [..., D + 4] int8 (any layout) -> [..., D] of `dtype`: values * scale."""
    d = rows.shape[-1] - INT8_SCALE_BYTES
    scale = rows[..., d:].contiguous().view(torch.float32)  # [..., 1]
    return (rows[..., :d].float() * scale).to(dtype)
