"""kvferry's bf16 decode-step GEMM (csrc/skinny_bf16.cpp): bf16 products summed in fp32 and rounded
to bf16, as oneDNN's bf16 linear computes them (up to the summation order), with its refusals; the
bf16 stack on it (the start-up race forced its way, over plain weights or a packed one's plain
copy) against the modules' forward and with the cache invisible, and a stack whose race picked
oneDNN's blocked layout alone never running it."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from torch import nn

from tests.workers._helpers import TinyModel, make_engine, random_prompt, warm_and_kept
from tests.workers.conftest import _build_tiny
from tests.workers.kernels.test_fused_decoder import _fused_and_modules, _mixed_batch
from workers.engine.kernels import bf16_linear, crossover
from workers.engine.kernels.bf16_linear import Bf16Linear
from workers.engine.kernels.fused_decoder import FusedDecoder
from workers.engine.llm_engine import LLMEngine

pytestmark = pytest.mark.skipif(not bf16_linear.skinny_runs(), reason="no AVX512-BF16 kernel here")
BF16 = {"dtype": "bfloat16", "kv_cache_dtype": "bfloat16"}


def _exact(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """x W^T + b in fp64 over x rounded to bf16 and the bf16 weight: what both GEMMs approximate."""
    y = x.to(torch.bfloat16).double() @ w.double().T
    return y if b is None else y + b.double()


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 17])
@pytest.mark.parametrize(("out", "bias"), [(64, False), (37, True), (3, True), (1, False)])
@pytest.mark.parametrize("features", [64, 100, 31])
def test_it_sums_bf16_products_in_fp32_and_rounds_to_bf16(
    rows: int, out: int, bias: bool, features: int
) -> None:
    """One row (16 features a block), two (8), more (4 rows a pass, a partial last pass), features
    off the blocks, widths off the 32-column vectors, with and without a bias."""
    gen = torch.Generator().manual_seed(rows * 1000 + out + features)
    x = torch.randn(rows, features, generator=gen)
    w = torch.randn(out, features, generator=gen).to(torch.bfloat16)
    b = torch.randn(out, generator=gen) if bias else None
    got = torch.ops.kvferry.skinny_bf16_linear(x, w, b)
    exact = _exact(x, w, b)
    assert got.dtype == torch.float32 and got.shape == (rows, out)
    assert torch.equal(got, got.to(torch.bfloat16).float()), "every output is a bf16 value"
    # fp32 sums of the products, then one rounding to bf16: within a bf16 step of the exact value
    magnitude = x.to(torch.bfloat16).double().abs() @ w.double().abs().T
    bound = exact.abs() * 2.0**-8 + magnitude * features * 2.0**-23 + 1e-30
    assert bool(((got.double() - exact).abs() <= bound).all())
    theirs = torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), w, b, "none", [], "").double()
    assert bool(((got.double() - theirs).abs() <= 2 * bound).all()), "as oneDNN's bf16 linear, up to order"


def test_a_rows_outputs_do_not_depend_on_the_rows_beside_it() -> None:
    """Bit for bit, alone or among 1 to 19 others (each row count blocks the features its own
    way): a sequence's tokens do not depend on the batch it decodes in."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(37, 100, generator=gen).to(torch.bfloat16)
    b = torch.randn(37, generator=gen)
    x = torch.randn(20, 100, generator=gen)
    alone = [torch.ops.kvferry.skinny_bf16_linear(x[i : i + 1].contiguous(), w, b)[0] for i in range(20)]
    for m in (2, 3, 4, 5, 8, 17, 20):
        together = torch.ops.kvferry.skinny_bf16_linear(x[:m].contiguous(), w, b)
        assert all(torch.equal(together[i], alone[i]) for i in range(m)), m


def test_no_rows_no_outputs() -> None:
    w = torch.randn(5, 8).to(torch.bfloat16)
    assert torch.ops.kvferry.skinny_bf16_linear(torch.randn(0, 8), w, None).shape == (0, 5)
    empty = torch.empty(0, 8, dtype=torch.bfloat16)
    assert torch.ops.kvferry.skinny_bf16_linear(torch.randn(3, 8), empty, None).shape == (3, 0)


@pytest.mark.parametrize(
    ("x", "w", "b", "match"),
    [
        (torch.randn(2, 8), torch.randn(4, 8), None, "bf16"),
        (torch.randn(2, 8).to(torch.bfloat16), torch.randn(4, 8).to(torch.bfloat16), None, "fp32"),
        (torch.randn(8, 2).T, torch.randn(4, 8).to(torch.bfloat16), None, "contiguous"),
        (torch.randn(2, 8), torch.randn(4, 9).to(torch.bfloat16), None, "features"),
        (torch.randn(2, 8), torch.randn(4, 8).to(torch.bfloat16), torch.randn(3), "bias"),
    ],
)
def test_it_refuses_what_it_would_misread(x: torch.Tensor, w: torch.Tensor, b: Any, match: str) -> None:
    with pytest.raises(RuntimeError, match=match):
        torch.ops.kvferry.skinny_bf16_linear(x, w, b)


@pytest.mark.parametrize(("packed", "plain"), [(False, False), (True, True)])
def test_a_linear_runs_it_up_to_its_rows_and_onednn_above(packed: bool, plain: bool) -> None:
    """Over its own plain weight, or a packed linear's plain copy."""
    module = Bf16Linear(nn.Linear(64, 48), packed=packed, plain=plain)
    module.max_rows = 4
    for rows in (1, 4, 5, 9):
        x = torch.randn(1, rows, 64)
        got = module(x)
        assert got.shape == (1, rows, 48)
        want = module.skinny(x[0]) if rows <= 4 else module.large(x[0])
        assert torch.equal(got[0], want)


def test_a_packed_linear_without_a_plain_copy_refuses_it() -> None:
    module = Bf16Linear(nn.Linear(64, 48), packed=True)
    assert module.plain_weight is None
    with pytest.raises(ValueError, match="plain weight"):
        module.skinny(torch.randn(2, 64))


def _forced(monkeypatch: pytest.MonkeyPatch, packed: bool, ours: bool) -> None:
    """The start-up race's outcome, set by hand (the int8 engine's layout race is not this one)."""
    monkeypatch.setattr(bf16_linear, "_plan", lambda linears: (packed, ours))


def _engine(tiny: TinyModel, **config: Any) -> LLMEngine:
    return make_engine(tiny.loaded, **BF16, **config)


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed+plain"])
@pytest.mark.parametrize("prefill", [False, True], ids=["decodes", "with-prefill"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # qwen2: the q/k/v biases
def test_the_bf16_stack_on_it_matches_the_modules_forward(
    tokenizer: object, arch: str, prefill: bool, packed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step's logits and pool writes, the fused stack against the modules (the same GEMM on both:
    kvferry's up to its crossover; with a prefill chunk the step's rows go past it, to oneDNN's over
    the plain weight or over its packed one beside the plain copy)."""
    _forced(monkeypatch, packed, ours=True)
    monkeypatch.setattr(crossover, "measure", lambda linears, rows=crossover.ROWS: 8)
    engine = _engine(_build_tiny(arch, tokenizer, seed=5), num_blocks=48, block_size=8)
    fused = engine.executor.runner.fused
    assert fused is not None and fused.bf16 and fused.skinny_rows == 8
    rng = random.Random(1)
    prompts = [random_prompt(rng, n) for n in (1, 7, 8, 15, 40)]
    late = prompts[4][:19] + random_prompt(rng, 9) if prefill else None
    batch = _mixed_batch(engine, prompts, late)
    assert (sum(s.num_new_tokens for s in batch) > 8) is prefill

    got, want, pool, want_pool = _fused_and_modules(engine, batch)

    # bf16 activations between the linears: the attention's summation order moves a bf16 step or so
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * float(want.abs().max()))
    torch.testing.assert_close(pool.float(), want_pool.float(), rtol=2e-2, atol=2e-2)


def test_on_it_the_cache_stays_invisible(tokenizer: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bf16 turn whose history comes back from the warm tier or the pool gives the tokens of the
    engine that kept it, every linear on kvferry's GEMM for the decodes."""
    _forced(monkeypatch, packed=True, ours=True)
    tiny = _build_tiny("llama", tokenizer, seed=5)
    got, kept, from_pool = warm_and_kept(tiny.loaded, 41, **BF16)
    q_proj = tiny.loaded.model.model.layers[0].self_attn.q_proj
    assert isinstance(q_proj, Bf16Linear) and q_proj.plain_weight is not None
    assert q_proj.max_rows >= crossover.ROWS[0]
    assert got.token_ids == kept.token_ids == from_pool.token_ids


def test_a_stack_without_plain_weights_never_runs_it(
    tokenizer: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race picked oneDNN's blocked layout alone: no rows for kvferry's GEMM, and the stack
    refuses any (it would read an opaque layout as [out, in]) before the pool is written."""
    _forced(monkeypatch, packed=True, ours=False)
    engine = _engine(_build_tiny("llama", tokenizer, seed=5), num_blocks=48, block_size=8)
    fused = engine.executor.runner.fused
    q_proj = engine.executor.runner.model.model.layers[0].self_attn.q_proj
    assert fused is not None and q_proj.plain_weight is None and fused.skinny_rows == 0
    monkeypatch.setattr(q_proj, "max_rows", 4)
    assert fused.skinny_rows == 0, "no plain copies: oneDNN's rows however many the linears say"
    batch = _mixed_batch(engine, [random_prompt(random.Random(2), 9)], None)
    pool = engine.executor.kv_cache.tensor
    before = pool.clone()
    monkeypatch.setattr(FusedDecoder, "skinny_rows", property(lambda self: 4))
    with pytest.raises(RuntimeError, match="needs their plain copies"):
        engine.executor.runner.run(batch)
    assert torch.equal(pool, before)
