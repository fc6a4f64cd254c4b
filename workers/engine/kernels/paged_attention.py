"""Attention over the paged KV pool, plugged into transformers' attention-function interface.

The model runs as one flattened batch: every scheduled token of every sequence is a position of
a single row ([1, T]). Each layer's attention call writes the new K/V into the pool through the
slot mapping, then reads each sequence's context back through its block table (on CPU fp32,
decodes are read in place by paged_decode.py's kernel). The model file
stays stock transformers; only the attention function is ours (and, on CPU, the packed linears
of packed_linear.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from kvstore.pool.kv_cache import KVCache
from workers.engine.kernels import paged_decode

ATTN_IMPLEMENTATION = "kvferry_paged"
METADATA_KWARG = "kvferry_attn"


@dataclass(frozen=True, slots=True)
class PrefillSegment:
    """A chunk of >1 new tokens of one sequence, at rows [start, start + length) of the batch."""

    start: int
    length: int
    context_len: int  # cached prefix + this chunk
    context_blocks: torch.Tensor | None  # [nb] blocks holding the context; None: no cached prefix
    mask: torch.Tensor | None  # [length, nb * block_size] bool, bottom-right causal; None: plain causal


@dataclass(frozen=True, slots=True)
class DecodeBucket:
    """Single-token steps at rows [start, start + len(blocks)) whose contexts are within 2x of each
    other, so padding them to the longest costs at most 2x the gather (not the batch's longest)."""

    start: int
    blocks: torch.Tensor  # [b, nb] each context's blocks, padded with block 0
    mask: torch.Tensor | None  # [b, 1, 1, nb * block_size] bool, True where a slot is real; None: all are


@dataclass(frozen=True, slots=True)
class DecodeTable:
    """Single-token steps at rows [start, start + len(lens)), read in place by the CPU kernel
    (paged_decode.py): no gather, no padding to a bucket's longest."""

    start: int
    blocks: torch.Tensor  # [n, nb] int64 each context's blocks, padded with block 0
    lens: torch.Tensor  # [n] int64 context lengths, the new token included


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    kv_cache: KVCache
    block_size: int
    slot_mapping: torch.Tensor  # [T]: pool slot of each new token
    prefills: tuple[PrefillSegment, ...]
    num_prefill_tokens: int  # rows [0, P) are prefill chunks, rows [P, T) single-token steps
    decodes: tuple[DecodeBucket, ...]  # covering rows [P, T), or
    decode_table: DecodeTable | None = None  # covering them all, for the CPU kernel


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    meta: AttentionMetadata = kwargs[METADATA_KWARG]
    layer = int(module.layer_idx)  # type: ignore[arg-type]
    _, num_heads, num_tokens, head_dim = query.shape  # [1, Hq, T, D]
    num_kv_heads = key.shape[1]
    groups = num_heads // num_kv_heads

    meta.kv_cache.write(layer, meta.slot_mapping, key[0].transpose(0, 1), value[0].transpose(0, 1))
    pool = meta.kv_cache.tensor[layer]  # [2, slots, Hkv, row]
    # Contexts are gathered whole blocks at a time (one contiguous block_size * Hkv * D run each)
    # with index_select, K and V in one pass: on a CPU pool far cheaper than `pool[:, slots]`
    # indexing slot by slot (docs/benchmarks.md). The tail of a last block is masked.
    bs = meta.block_size
    row = pool.shape[-1]  # head_dim, or an int8 pool's values and scale
    by_block = pool.view(2, pool.shape[1] // bs, bs * num_kv_heads * row)

    def gather(blocks: torch.Tensor) -> torch.Tensor:  # [...] block ids -> [2, ..., slots, Hkv, D]
        kv = by_block.index_select(1, blocks.flatten())
        kv = kv.view(2, *blocks.shape[:-1], blocks.shape[-1] * bs, num_kv_heads, row)
        return meta.kv_cache.dense(kv, query.dtype)  # a narrower pool widened, an int8 one dequantised

    out = query.new_empty(num_tokens, num_heads, head_dim)

    for seg in meta.prefills:
        rows = slice(seg.start, seg.start + seg.length)
        q = query[:, :, rows]  # [1, Hq, n, D]
        if seg.context_blocks is None:
            k, v = key[:, :, rows], value[:, :, rows]
        else:
            kv = gather(seg.context_blocks)  # [2, W, Hkv, D]
            k, v = kv[0].transpose(0, 1).unsqueeze(0), kv[1].transpose(0, 1).unsqueeze(0)  # [1, Hkv, W, D]
        o = F.scaled_dot_product_attention(
            q, k, v, attn_mask=seg.mask, is_causal=seg.mask is None, scale=scaling, enable_gqa=groups > 1
        )
        out[rows] = o[0].transpose(0, 1)

    if meta.decode_table is not None:
        table = meta.decode_table
        rows = slice(table.start, table.start + table.lens.shape[0])
        q = query[0, :, rows].transpose(0, 1).contiguous()  # [n, Hq, D]
        scale = head_dim**-0.5 if scaling is None else scaling
        paged_decode.paged_decode(out[rows], q, pool, table.blocks, table.lens, bs, scale)

    for bucket in meta.decodes:
        batch = bucket.blocks.shape[0]
        rows = slice(bucket.start, bucket.start + batch)
        # One query per sequence: fold the query heads that share a kv head into the query axis,
        # [b, Hkv, groups, D], so K/V are read once per kv head instead of being repeated.
        q = query[0, :, rows].transpose(0, 1).reshape(batch, num_kv_heads, groups, head_dim)
        kv = gather(bucket.blocks)  # [2, b, W, Hkv, D]
        k, v = kv[0].transpose(1, 2), kv[1].transpose(1, 2)  # [b, Hkv, W, D]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=bucket.mask, scale=scaling)
        out[rows] = o.reshape(batch, num_heads, head_dim)

    return out.unsqueeze(0), None  # [1, T, Hq, D]


def register() -> None:
    AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)
