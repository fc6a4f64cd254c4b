"""The decode-attention kernel (csrc/paged_decode.cpp) against SDPA over a gathered, widened copy
of the same rows, for each pool dtype: ragged lengths (1 token, a tile and one more, across block
boundaries), GQA, several head sizes."""

from __future__ import annotations

import pytest
import torch

from kvstore.pool import int8_rows
from workers.engine.kernels import paged_decode

pytestmark = pytest.mark.skipif(not paged_decode.available(), reason="the CPU kernels do not build here")
LENS = [1, 15, 16, 17, 33, 100, 47]  # within a tile, a tile exactly, one past, several blocks


def _pool(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return int8_rows.quantize(values) if dtype == torch.int8 else values.to(dtype)


@pytest.mark.parametrize("dtype", paged_decode.POOL_DTYPES)
@pytest.mark.parametrize(
    ("hkv", "groups", "d", "bs"), [(3, 3, 64, 16), (2, 4, 128, 8), (1, 1, 32, 4), (4, 2, 16, 16)]
)
def test_the_kernel_is_sdpa_over_the_gathered_rows(
    dtype: torch.dtype, hkv: int, groups: int, d: int, bs: int
) -> None:
    gen = torch.Generator().manual_seed(hkv * 100 + d)
    n, width = len(LENS), 100 // bs + 1
    nblocks = n * width + 3
    values = torch.randn(2, nblocks * bs, hkv, d, generator=gen) * 2
    pool = _pool(values, dtype)
    blocks = torch.randperm(nblocks, generator=gen)[: n * width].view(n, width)  # scattered blocks
    lens = torch.tensor(LENS)
    query = torch.randn(n, hkv * groups, d, generator=gen)
    got = torch.full_like(query, float("nan"))
    paged_decode.paged_decode(got, query, pool, blocks, lens, bs, d**-0.5)
    want = paged_decode.reference(query, pool, blocks, lens, bs, d**-0.5)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_one_large_score_takes_the_softmax() -> None:
    """A key equal to the query scaled up: its weight ~1, the output its value (max subtracted right)."""
    gen = torch.Generator().manual_seed(5)
    bs, hkv, d = 16, 1, 64
    values = torch.randn(2, 4 * bs, hkv, d, generator=gen)
    query = torch.randn(1, 1, d, generator=gen)
    values[0, 37, 0] = query[0, 0] * 40
    got = torch.empty_like(query)
    blocks, lens = torch.tensor([[2, 0, 3, 1]]), torch.tensor([50])  # slot 37 is block 2's token 5
    paged_decode.paged_decode(got, query, values, blocks, lens, bs, d**-0.5)
    torch.testing.assert_close(got[0, 0], values[1, 37, 0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got, paged_decode.reference(query, values, blocks, lens, bs, d**-0.5))
