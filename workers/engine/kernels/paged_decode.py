"""The CPU decode-attention kernel (csrc/paged_decode.cpp, built by build.py).

On CPU torch's path for a decode step's attention is two memory-bound passes: `index_select`
copying every context out of the pool, then SDPA over the copy, whose flash kernel does little with
one query row. `kvferry::paged_decode` reads each context where it lies, through its block table,
with no copy (docs/benchmarks.md). With AVX-512 it goes 16 slots at a time, each row widened to
fp32 once (bf16 exactly, int8 dequantised) for the query heads of its KV head, the tile's scores
summed by one transpose-reduce: a bf16 pool is read as its fp32 widening would be, in half the
bytes, int8 in a quarter (`python -m ops.bench.engine.attention --against main` times it).
vLLM's CPU backend and llama.cpp both attend over their caches in place the same way.

Where the library cannot be built (no compiler), or a probe of the kernel disagrees with SDPA,
decodes keep the index_select + SDPA path, which CUDA and other dtypes always use.
"""

from __future__ import annotations

import logging
import threading

import torch
import torch.nn.functional as F

from kvstore.pool import int8_rows
from workers.engine.kernels import build

log = logging.getLogger(__name__)
HEAD_DIMS = (16, 32, 64, 128, 256)  # the head sizes the kernel is instantiated for
POOL_DTYPES = (torch.float32, torch.bfloat16, torch.int8)  # the pools it reads (fp32 queries and outputs)
_lock = threading.Lock()
_built: bool | None = None


def available() -> bool:
    """True once `torch.ops.kvferry.paged_decode` is loaded and agrees with SDPA."""
    global _built
    with _lock:
        if _built is None:
            _built = build.built() and _probe()
        return _built


def _probe() -> bool:
    try:
        return _agrees()
    except Exception as err:  # e.g. a library of another signature: the torch path stays
        log.warning("the CPU decode-attention kernel failed its probe (%s); decodes gather + SDPA", err)
        return False


def paged_decode(
    out: torch.Tensor,
    query: torch.Tensor,
    pool: torch.Tensor,
    blocks: torch.Tensor,
    lens: torch.Tensor,
    block_size: int,
    scale: float,
) -> None:
    """out[i] = attention of query[i] ([Hq, D]) over the first lens[i] slots of blocks[i] in pool
    ([2, slots, Hkv, D], K then V; an int8 pool [2, slots, Hkv, D + 4], each row's scale after its
    values: kvstore/pool/int8_rows.py). The kernel checks shapes, dtypes and every block id."""
    torch.ops.kvferry.paged_decode(out, query, pool, blocks, lens, block_size, scale)


def reference(
    query: torch.Tensor,
    pool: torch.Tensor,
    blocks: torch.Tensor,
    lens: torch.Tensor,
    block_size: int,
    scale: float,
) -> torch.Tensor:
    """What `paged_decode` computes, by torch: each row's slots gathered out of the pool, widened
    to fp32 (an int8 pool dequantised), and SDPA over the copy, GQA by viewing the query heads."""
    hkv, d = pool.shape[2], query.shape[2]
    out = torch.empty_like(query)
    for i in range(query.shape[0]):
        slots = (blocks[i, :, None] * block_size + torch.arange(block_size)).flatten()[: int(lens[i])]
        rows = pool[:, slots]
        rows = int8_rows.dequantize(rows) if pool.dtype == torch.int8 else rows.float()
        k, v = rows[0].transpose(0, 1), rows[1].transpose(0, 1)  # [Hkv, L, D]
        q = query[i].view(hkv, -1, d)
        out[i] = F.scaled_dot_product_attention(q, k, v, scale=scale).reshape(-1, d)
    return out


def _agrees() -> bool:
    """One random probe per pool dtype against SDPA over a widened copy (`reference`): ragged
    lengths across tiles and blocks, GQA."""
    gen = torch.Generator().manual_seed(0)
    bs, nblocks, hkv, groups, d = 4, 32, 2, 3, 64
    lens = torch.tensor([40, 5, 17])
    blocks = torch.randperm(nblocks, generator=gen)[:30].view(3, 10)
    query = torch.randn(3, hkv * groups, d, generator=gen)
    values = torch.randn(2, nblocks * bs, hkv, d, generator=gen)
    for pool in (values, values.to(torch.bfloat16), int8_rows.quantize(values)):
        out = torch.empty_like(query)
        paged_decode(out, query, pool, blocks, lens, bs, d**-0.5)
        if not torch.allclose(out, reference(query, pool, blocks, lens, bs, d**-0.5), rtol=1e-4, atol=1e-5):
            log.warning(
                "the CPU decode-attention kernel disagrees with SDPA (%s pool); decodes gather + SDPA",
                pool.dtype,
            )
            return False
    return True
