"""int8 weight-only engines (`quantization int8`, issue 41): how the mode resolves, the fingerprint
covering it, the int8 linears computing (x q^T) * s + b on either kernel, and the cache staying
invisible: an int8 turn whose history comes back from the pool, the warm tier or another engine's
pack gives the tokens of the same turn on an engine that kept it."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import pytest
import torch
from torch import nn

from broker.sampling import SamplingParams
from kvstore.tiers.codec import decode_pack
from tests.workers._helpers import (
    NO_EOS,
    TinyModel,
    make_engine,
    move_history,
    moved_and_kept,
    random_prompt,
    run_checked,
    warm_and_kept,
)
from tests.workers.conftest import _build_tiny
from workers.engine.kernels import int8_linear, paged_decode
from workers.engine.kernels.bf16_linear import Bf16Linear
from workers.engine.kernels.int8_linear import Int8Linear
from workers.engine.model.precision import Precision

INT8 = {"dtype": "bfloat16", "kv_cache_dtype": "bfloat16", "quantization": "int8"}

needs_int8 = pytest.mark.skipif(
    not int8_linear.runs(), reason="torch's int8 kernel or oneDNN's bf16 GEMM does not run here"
)


def test_int8_resolves_to_bf16_compute_and_its_own_fingerprint() -> None:
    p = Precision.resolve("auto", "auto", "cpu", "int8")
    assert p == Precision("bfloat16", "bfloat16", "cpu", "int8")
    assert p.tag == "+w-int8+kv-bf16"
    assert Precision.resolve("bfloat16", "float32", "cpu", "int8").tag == "+w-int8+kv-f32"
    tags = {Precision(w, kv).tag for w in ("float32", "bfloat16") for kv in ("float32", "bfloat16")}
    assert p.tag not in tags  # never read as a bf16 engine's blocks
    with pytest.raises(ValueError, match="bf16"):
        Precision.resolve("float32", "auto", "cpu", "int8")
    with pytest.raises(ValueError, match="quantization"):
        Precision.resolve("auto", "auto", "cpu", "int4")


def test_quantize_is_per_channel_symmetric_within_half_a_step() -> None:
    w = torch.randn(24, 40) * torch.linspace(0.01, 3.0, 24)[:, None]  # channels of different ranges
    q, s = int8_linear.quantize(w)
    assert q.dtype == torch.int8 and s.dtype == torch.bfloat16 and q.abs().max() <= 127
    err = (w - q.float() * s.float()[:, None]).abs()
    assert (err <= s.float()[:, None] / 2 + 1e-6).all()


@needs_int8
@pytest.mark.parametrize("int8_rows", [16, 0], ids=["int8-kernel", "bf16-gemm"])
@pytest.mark.parametrize("rows", [1, 5])
def test_an_int8_linear_computes_its_dequantized_weight(int8_rows: int, rows: int) -> None:
    gen = torch.Generator().manual_seed(7)
    linear = nn.Linear(64, 48)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(48, 64, generator=gen))
        linear.bias.copy_(torch.randn(48, generator=gen))
    module = Int8Linear(linear, packed=False, max_int8_rows=int8_rows)
    q, s = int8_linear.quantize(linear.weight)
    x = torch.randn(rows, 64, generator=gen)
    want = x.bfloat16().float() @ (q.float() * s.float()[:, None]).T + linear.bias
    got = module(x)
    assert got.dtype == torch.float32 and got.shape == (rows, 48)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)  # the product's output rounded to bf16
    assert not torch.allclose(got, linear(x), rtol=1e-4, atol=1e-4)  # quantised: not the fp32 weights


@pytest.fixture(scope="module")
def int8_tiny(tokenizer: object) -> Callable[[str], TinyModel]:
    """A tiny model per case of its own: an int8 engine quantises its linears in place."""
    built: dict[str, TinyModel] = {}

    def get(case: str = "llama") -> TinyModel:
        if case not in built:
            built[case] = _build_tiny(case.split("/")[0], tokenizer, seed=6)
        return built[case]

    return get


@needs_int8
def test_an_int8_engine_runs_fused_and_refuses_other_precisions(
    int8_tiny: Callable[[str], TinyModel],
) -> None:
    tiny = int8_tiny("llama")
    engine = make_engine(tiny.loaded, num_blocks=16, **INT8)
    assert engine.served.precision == Precision("bfloat16", "bfloat16", "cpu", "int8")
    assert engine.served.fingerprint.endswith("+w-int8+kv-bf16")
    assert engine.stats().dtype == "int8" and engine.stats().kv_cache_dtype == "bfloat16"
    assert (engine.executor.runner.fused is not None) == paged_decode.available()
    layer = tiny.loaded.model.model.layers[0]
    assert isinstance(layer.mlp.down_proj, Int8Linear)
    assert isinstance(tiny.loaded.model.lm_head, Bf16Linear)  # not quantised: bf16, as a bf16 engine's
    with pytest.raises(ValueError, match="int8"):
        make_engine(tiny.loaded, num_blocks=16, dtype="bfloat16")


@needs_int8
@pytest.mark.parametrize("case", ["llama/int8-kernel", "qwen3/bf16-gemm"])
def test_int8_history_from_the_pool_or_warm_tier_gives_the_tokens_of_a_kept_one(
    int8_tiny: Callable[[str], TinyModel], case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # each C++ path of the fused stack's int8 linears: the int8 kernel at every decode, or none
    monkeypatch.setattr(int8_linear, "choose", lambda linears, packed: 16 if case.endswith("kernel") else 0)
    got, kept, from_pool = warm_and_kept(int8_tiny(case).loaded, 43, **INT8)
    assert got.token_ids == kept.token_ids == from_pool.token_ids


@needs_int8
def test_int8_blocks_moved_through_a_pack_give_the_tokens_of_the_engine_that_made_them(
    int8_tiny: Callable[[str], TinyModel],
) -> None:
    tiny = int8_tiny("llama")
    rng = random.Random(44)
    history = random_prompt(rng, 48)  # 3 full blocks
    turn = [*history, *random_prompt(rng, 7)]
    params = SamplingParams(max_tokens=8, **NO_EOS)
    source = make_engine(tiny.loaded, num_blocks=32, **INT8)
    target = make_engine(tiny.loaded, num_blocks=32, warm_cache_size_bytes=1 << 20, **INT8)
    assert target.tiers is not None
    pack = move_history(source, target, history)
    # a bf16 engine of the same weights and pool dtype refuses the pack: another chain root
    bf16_fingerprint = tiny.loaded.fingerprint + Precision("bfloat16", "bfloat16").tag
    bf16 = dataclasses.replace(source.served.kv_format, model_fingerprint=bf16_fingerprint)
    refused = decode_pack(bf16, pack)
    assert not refused.blocks and refused.reason is not None
    got, kept = moved_and_kept(source, target, history, turn, params)
    assert got.token_ids == kept.token_ids


@needs_int8
@pytest.mark.parametrize("int8_rows", [16, 0], ids=["int8-kernel", "bf16-gemm"])
def test_the_fused_stack_computes_the_int8_modules_tokens(
    int8_tiny: Callable[[str], TinyModel], int8_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not paged_decode.available():
        pytest.skip("the CPU kernels do not build here")
    monkeypatch.setattr(int8_linear, "choose", lambda linears, packed: int8_rows)
    tiny = int8_tiny(f"llama/fused-{int8_rows}")
    rng = random.Random(45)
    prompts = {
        f"p{i}": (random_prompt(rng, 20 + 7 * i), SamplingParams(max_tokens=10, **NO_EOS)) for i in range(3)
    }
    fp32_kv = INT8 | {"kv_cache_dtype": "float32"}  # the modules' prefill attends unrounded K/V
    fused = make_engine(tiny.loaded, num_blocks=32, **fp32_kv)
    modules = make_engine(tiny.loaded, num_blocks=32, fused_decode=False, **fp32_kv)
    assert fused.executor.runner.fused is not None and modules.executor.runner.fused is None
    got, want = run_checked(fused, prompts), run_checked(modules, prompts)
    assert {k: v.token_ids for k, v in got.items()} == {k: v.token_ids for k, v in want.items()}


@needs_int8
@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda t: t[:-1], "int8 takes"),
        (lambda t: [*t[:-1], t[-1].float()], "scales of weight 16 of layer 1"),
        (lambda t: [*t[:2], t[2].T.contiguous(), *t[3:]], "int8 copy of weight 3 of layer 0"),
    ],
    ids=["one-missing", "fp32-scales", "transposed"],
)
def test_the_fused_stack_refuses_bad_int8_weights_before_writing(
    int8_tiny: Callable[[str], TinyModel],
    monkeypatch: pytest.MonkeyPatch,
    bad: Callable[[list[torch.Tensor]], list[torch.Tensor]],
    match: str,
) -> None:
    if not paged_decode.available():
        pytest.skip("the CPU kernels do not build here")
    monkeypatch.setattr(int8_linear, "choose", lambda linears, packed: 16)
    tiny = int8_tiny("llama/refuse")
    engine = make_engine(tiny.loaded, num_blocks=16, **INT8)
    fused = engine.executor.runner.fused
    assert fused is not None
    fused.int8 = bad(fused.int8)
    pool = engine.executor.kv_cache.tensor
    before = pool.clone()
    hidden_ids = torch.tensor([5, 6])
    with pytest.raises(RuntimeError, match=match):
        fused.forward(
            hidden_ids,
            torch.tensor([0, 1]),
            torch.tensor([0, 1]),
            torch.zeros(2, 1, dtype=torch.long),
            torch.tensor([1, 2]),
            torch.tensor([2]),
        )
    assert torch.equal(pool, before)
