"""The cold tier's block encodings: exact bytes, or a lossy, smaller form (opt-in).

``exact`` stores the pool's bytes as they are. ``fp16`` / ``bf16`` store every element in 2 bytes.
``int8`` stores, per block, fp32 scales for each (layer, K or V, kv head) (symmetric absmax over
the block's tokens and head dim) followed by the int8 values. Only Redis sees these forms: decoding
gives back the pool's dtype and layout, so the hot pool and the warm tier stay as they are.

One block encoded, ``int8``: [scales: layers x 2 x kv_heads fp32][values: layers x 2 x bs x heads x dim
int8]; ``fp16``/``bf16``: the block's elements in that dtype; ``exact``: the pool's bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, cast

import numpy as np
import torch

from kvstore.layout import KVFormat, bytes_view

TierDtype = Literal["exact", "int8", "fp16", "bf16"]
TIER_DTYPES: tuple[TierDtype, ...] = ("exact", "int8", "fp16", "bf16")
_TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}


def check_tier_dtype(name: str) -> TierDtype:
    if name not in TIER_DTYPES:
        raise ValueError(f"tier dtype must be one of {list(TIER_DTYPES)}, got {name!r}")
    return cast("TierDtype", name)


def _num_scales(fmt: KVFormat) -> int:
    layers, _, _, heads, _ = fmt.shape
    return layers * 2 * heads


def encoded_nbytes(fmt: KVFormat, tier_dtype: TierDtype) -> int:
    """Bytes one block takes in a pack of this tier dtype. An int8 pool's blocks (values and
    scales) are stored exact only: they are already the small form."""
    if tier_dtype == "exact":
        return fmt.nbytes
    if fmt.dtype not in _TORCH:
        raise ValueError(f"a {fmt.dtype} pool's blocks are stored exact, not {tier_dtype}")
    numel = math.prod(fmt.shape)
    if tier_dtype == "int8":
        return 4 * _num_scales(fmt) + numel
    return 2 * numel


def encode(fmt: KVFormat, tier_dtype: TierDtype, kvs: Sequence[object]) -> list[object]:
    """Each block's stored bytes (bytes-like, ``encoded_nbytes`` each), from its pool bytes."""
    if tier_dtype == "exact" or not kvs:
        return list(kvs)
    encoded_nbytes(fmt, tier_dtype)  # raises for a pool of no lossy form
    x = torch.stack([bytes_view(kv).view(_TORCH[fmt.dtype]) for kv in kvs]).float()
    x = x.view(len(kvs), *fmt.shape)  # [n, layers, 2, bs, heads, dim]
    if tier_dtype in _HALF:
        out = x.to(_HALF[tier_dtype]).reshape(len(kvs), -1).view(torch.uint8)
    else:
        absmax = x.abs().amax(dim=(3, 5))  # [n, layers, 2, heads]
        scales = torch.where(absmax > 0, absmax / 127.0, torch.ones_like(absmax))
        q = torch.round(x / scales[:, :, :, None, :, None]).clamp_(-127, 127).to(torch.int8)
        out = torch.cat(
            [scales.reshape(len(kvs), -1).view(torch.uint8), q.reshape(len(kvs), -1).view(torch.uint8)], 1
        )
    rows = out.contiguous().numpy()
    return [memoryview(rows[i]) for i in range(len(kvs))]


def decode(fmt: KVFormat, tier_dtype: TierDtype, payload: memoryview, count: int) -> list[memoryview]:
    """The pool bytes of ``count`` blocks stored back to back in ``payload``: views into it for
    ``exact``, else one buffer of the pool's dtype, decoded in one vectorised pass."""
    stride = encoded_nbytes(fmt, tier_dtype)
    if tier_dtype == "exact":
        return [payload[i * stride : (i + 1) * stride] for i in range(count)]
    raw = bytes_view(payload).view(count, stride)
    if tier_dtype in _HALF:
        x = raw.view(_HALF[tier_dtype]).view(count, *fmt.shape)
        out = x.to(_TORCH[fmt.dtype])
    else:
        ns = _num_scales(fmt)
        layers, _, _, heads, _ = fmt.shape
        scales = raw[:, : 4 * ns].contiguous().view(torch.float32).view(count, layers, 2, 1, heads, 1)
        q = raw[:, 4 * ns :].view(torch.int8).view(count, *fmt.shape)
        out = (q.float() * scales).to(_TORCH[fmt.dtype])
    rows: np.ndarray = out.contiguous().view(torch.uint8).view(count, -1).numpy()
    rows.flags.writeable = False  # a read-only buffer, as an exact block's is: hashable, never changed
    return [memoryview(rows[i]) for i in range(count)]
