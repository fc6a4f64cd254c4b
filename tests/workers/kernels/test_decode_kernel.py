"""The CPU decode-attention kernel against SDPA over gathered contexts, and its refusals."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from workers.engine.kernels import paged_decode

needs_kernel = pytest.mark.skipif(not paged_decode.available(), reason="the CPU kernel did not build here")


def test_the_kernel_builds_wherever_there_is_a_compiler() -> None:
    """The fallback is for machines without g++, not a place for a broken build to hide."""
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler on this machine")
    assert paged_decode.available()


def _pool(num_blocks: int, bs: int, hkv: int, d: int, seed: int) -> torch.Tensor:
    return torch.randn(2, num_blocks * bs, hkv, d, generator=torch.Generator().manual_seed(seed))


def _reference(
    query: torch.Tensor, pool: torch.Tensor, blocks: torch.Tensor, lens: torch.Tensor, bs: int
) -> torch.Tensor:
    n, hq, d = query.shape
    hkv = pool.shape[2]
    out = torch.empty_like(query)
    for i in range(n):
        slots = (blocks[i, :, None] * bs + torch.arange(bs)).flatten()[: int(lens[i])]
        k, v = pool[0, slots].transpose(0, 1), pool[1, slots].transpose(0, 1)  # [Hkv, L, D]
        q = query[i].view(hkv, hq // hkv, d)
        out[i] = F.scaled_dot_product_attention(q, k, v, scale=d**-0.5).reshape(hq, d)
    return out


@needs_kernel
@pytest.mark.parametrize(("hkv", "groups", "d"), [(2, 2, 16), (3, 3, 64), (1, 8, 128), (4, 1, 32)])
def test_matches_sdpa_over_ragged_paged_contexts(hkv: int, groups: int, d: int) -> None:
    """Lengths of 1, a block edge, one past it and a full table, over shuffled blocks."""
    bs, num_blocks = 8, 64
    lens = torch.tensor([1, 8, 9, 40, 17, 33])
    width = 5
    gen = torch.Generator().manual_seed(d)
    pool = _pool(num_blocks, bs, hkv, d, seed=d)
    blocks = torch.randperm(num_blocks, generator=gen)[: len(lens) * width].view(len(lens), width)
    query = torch.randn(len(lens), hkv * groups, d, generator=gen)
    out = torch.full_like(query, float("nan"))

    paged_decode.paged_decode(out, query, pool, blocks, lens, bs, d**-0.5)

    torch.testing.assert_close(out, _reference(query, pool, blocks, lens, bs), rtol=1e-5, atol=1e-5)


@needs_kernel
def test_reads_only_each_rows_own_slots() -> None:
    """Poison every slot past each context's length (and every block it does not own): the result
    must not move."""
    bs, hkv, d = 4, 2, 16
    pool = _pool(16, bs, hkv, d, seed=1)
    blocks = torch.tensor([[3, 7, 0], [5, 0, 0]])
    lens = torch.tensor([6, 2])
    query = torch.randn(2, 4, d)
    want = _reference(query, pool, blocks, lens, bs)
    poisoned = torch.full_like(pool, 1e30)
    for i, n in enumerate(lens.tolist()):
        slots = (blocks[i, :, None] * bs + torch.arange(bs)).flatten()[:n]
        poisoned[:, slots] = pool[:, slots]
    out = torch.empty_like(query)

    paged_decode.paged_decode(out, query, poisoned, blocks, lens, bs, d**-0.5)

    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize(
    ("blocks", "lens", "match"),
    [
        ([[0, 16]], [5], "block id outside the pool"),
        ([[0, -1]], [5], "block id outside the pool"),
        ([[0, 1]], [9], "context length out of its table"),
        ([[0, 1]], [0], "context length out of its table"),
    ],
)
def test_refuses_tables_that_would_read_outside_the_pool(
    blocks: list[list[int]], lens: list[int], match: str
) -> None:
    pool = _pool(16, 4, 2, 16, seed=2)
    query = torch.randn(1, 4, 16)
    with pytest.raises(RuntimeError, match=match):
        paged_decode.paged_decode(
            torch.empty_like(query), query, pool, torch.tensor(blocks), torch.tensor(lens), 4, 0.25
        )


@needs_kernel
def test_refuses_other_dtypes_and_head_sizes() -> None:
    blocks, lens = torch.tensor([[0]]), torch.tensor([3])
    pool = _pool(4, 4, 1, 16, seed=3)
    query = torch.randn(1, 1, 16)
    with pytest.raises(RuntimeError, match="fp32"):
        paged_decode.paged_decode(
            torch.empty_like(query).half(), query.half(), pool.half(), blocks, lens, 4, 0.25
        )
    odd_pool, odd_query = _pool(4, 4, 1, 24, seed=4), torch.randn(1, 1, 24)
    with pytest.raises(RuntimeError, match="head_dim 24 not built"):
        paged_decode.paged_decode(torch.empty_like(odd_query), odd_query, odd_pool, blocks, lens, 4, 0.25)


def test_a_library_that_fails_its_probe_leaves_the_torch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def raising() -> bool:
        raise RuntimeError("kvferry::paged_decode() expected 7 arguments")

    monkeypatch.setattr(paged_decode, "_built", None)
    monkeypatch.setattr(paged_decode, "_agrees", raising)
    assert paged_decode.available() is False
