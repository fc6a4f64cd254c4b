"""The CPU decode-attention kernel (csrc/paged_decode.cpp, built by build.py).

On CPU torch's path for a decode step's attention is two memory-bound passes: `index_select`
copying every context out of the pool, then SDPA over the copy, whose flash kernel does little with
one query row. `kvferry::paged_decode` reads each context where it lies, through its block table,
with no copy (docs/benchmarks.md).
vLLM's CPU backend and llama.cpp both attend over their caches in place the same way.

Where the library cannot be built (no compiler), or a probe of the kernel disagrees with SDPA,
decodes keep the index_select + SDPA path, which CUDA and other dtypes always use.
"""

from __future__ import annotations

import logging
import threading

import torch
import torch.nn.functional as F

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


def _agrees() -> bool:
    """One random probe against SDPA over a gathered copy, ragged lengths and GQA included."""
    gen = torch.Generator().manual_seed(0)
    bs, nblocks, hkv, groups, d, n = 4, 12, 2, 3, 64, 3
    pool = torch.randn(2, nblocks * bs, hkv, d, generator=gen)
    blocks = torch.randperm(nblocks, generator=gen)[: n * 3].view(n, 3)
    lens = torch.tensor([12, 5, 9])
    query = torch.randn(n, hkv * groups, d, generator=gen)
    out = torch.empty_like(query)
    paged_decode(out, query, pool, blocks, lens, bs, d**-0.5)
    for i in range(n):
        slots = (blocks[i, :, None] * bs + torch.arange(bs)).flatten()[: int(lens[i])]
        k, v = pool[0, slots].transpose(0, 1), pool[1, slots].transpose(0, 1)  # [Hkv, L, D]
        q = query[i].view(hkv, groups, d)
        want = F.scaled_dot_product_attention(q, k, v, scale=d**-0.5).reshape(hkv * groups, d)
        if not torch.allclose(out[i], want, rtol=1e-4, atol=1e-5):
            log.warning("the CPU decode-attention kernel disagrees with SDPA; decodes gather + SDPA")
            return False
    return True
