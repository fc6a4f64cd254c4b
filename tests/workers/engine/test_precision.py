"""Engines below fp32 (issue 41): `auto` resolution, the fingerprint covering the precision, bf16
weights and a bf16 pool on the fused stack, and the cache staying invisible: a turn whose history
comes back from the warm tier or from another engine's block bytes gives the tokens of the same
turn on an engine that kept it."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

import pytest
import torch

from broker.sampling import SamplingParams
from kvstore.tiers.codec import decode_pack
from tests.workers._helpers import (
    NO_EOS,
    TinyModel,
    make_engine,
    move_history,
    moved_and_kept,
    random_prompt,
    warm_and_kept,
)
from tests.workers.conftest import _build_tiny
from workers.engine.kernels import bf16_linear, paged_decode
from workers.engine.model import precision
from workers.engine.model.precision import Precision

BF16 = {"dtype": "bfloat16", "kv_cache_dtype": "bfloat16"}


def test_auto_is_bf16_only_where_the_device_computes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "native_bf16", lambda device: False)
    assert Precision.resolve("auto", "auto", "cpu") == Precision("float32", "float32", "cpu")
    monkeypatch.setattr(precision, "native_bf16", lambda device: True)
    assert Precision.resolve("auto", "auto", "cpu") == Precision("bfloat16", "bfloat16", "cpu")
    assert Precision.resolve("auto", "float32", "cpu").kv == "float32"
    assert Precision.resolve("float32", "auto", "cpu") == Precision("float32", "float32", "cpu")
    assert Precision.resolve("float32", "bfloat16", "cpu").kv == "bfloat16"
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        Precision.resolve("auto", "int4", "cpu")


def test_the_fingerprint_covers_the_precision() -> None:
    tags = {Precision(w, kv).tag for w in ("float32", "bfloat16") for kv in ("float32", "bfloat16")}
    assert Precision("float32", "float32").tag == "" and len(tags) == 4  # fp32 keeps the weights' own


@pytest.fixture(scope="module")
def bf16_tiny(tokenizer: object) -> Callable[[str], TinyModel]:
    """A tiny model per arch of its own: a bf16 engine converts its linears in place."""
    built: dict[str, TinyModel] = {}

    def get(arch: str = "llama") -> TinyModel:
        if arch not in built:
            built[arch] = _build_tiny(arch, tokenizer, seed=5)
        return built[arch]

    return get


def test_an_fp32_engine_refuses_a_model_converted_to_bf16(bf16_tiny: Callable[[str], TinyModel]) -> None:
    if not bf16_linear.runs():
        pytest.skip("oneDNN's bf16 GEMM does not run here")
    tiny = bf16_tiny("llama")
    engine = make_engine(tiny.loaded, num_blocks=16, **BF16)
    assert engine.served.precision == Precision("bfloat16", "bfloat16")
    assert engine.executor.kv_cache.tensor.dtype == torch.bfloat16
    assert engine.served.fingerprint.endswith("+w-bf16+kv-bf16")
    assert engine.stats().dtype == "bfloat16" and engine.stats().kv_cache_dtype == "bfloat16"
    with pytest.raises(ValueError, match="converted to bf16"):
        make_engine(tiny.loaded, num_blocks=16)


def test_a_bf16_engine_computes_its_logits_on_a_bf16_head_in_fp32_out(tokenizer: object) -> None:
    if not bf16_linear.runs():
        pytest.skip("oneDNN's bf16 GEMM does not run here")
    tiny = _build_tiny("llama", tokenizer, seed=6)
    model = tiny.loaded.model
    fp32_head = model.lm_head.weight.detach().clone()
    engine = make_engine(tiny.loaded, num_blocks=16, **BF16)
    head = model.lm_head
    assert isinstance(head, bf16_linear.Bf16Linear)
    assert model.get_input_embeddings().weight.dtype == torch.float32  # the lookup stays fp32
    hidden = torch.randn(5, head.in_features)
    logits = engine.executor.runner.logits(hidden)
    assert logits.dtype == torch.float32 and logits.shape == (5, head.out_features)
    exact = hidden @ fp32_head.T
    # bf16 operands, fp32 accumulation, the result rounded to bf16: within a few bf16 steps of fp32
    bound = 4 * (hidden.abs() @ fp32_head.abs().T) * 2.0**-8
    assert bool(((logits - exact).abs() <= bound).all())
    assert not bf16_linear.convert_head(model)  # idempotent: already converted


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_bf16_history_from_the_warm_tier_gives_the_tokens_of_a_kept_one(
    bf16_tiny: Callable[[str], TinyModel], arch: str
) -> None:
    if not bf16_linear.runs():
        pytest.skip("oneDNN's bf16 GEMM does not run here")
    got, kept, from_pool = warm_and_kept(bf16_tiny(arch).loaded, 41, **BF16)
    assert got.token_ids == kept.token_ids == from_pool.token_ids


def test_bf16_blocks_moved_through_a_pack_give_the_tokens_of_the_engine_that_made_them(
    bf16_tiny: Callable[[str], TinyModel],
) -> None:
    if not bf16_linear.runs():
        pytest.skip("oneDNN's bf16 GEMM does not run here")
    tiny = bf16_tiny("llama")
    rng = random.Random(42)
    history = random_prompt(rng, 48)  # 3 full blocks
    turn = [*history, *random_prompt(rng, 7)]
    params = SamplingParams(max_tokens=8, **NO_EOS)
    source = make_engine(tiny.loaded, num_blocks=32, **BF16)
    target = make_engine(tiny.loaded, num_blocks=32, warm_cache_size_bytes=1 << 20, **BF16)
    assert target.tiers is not None and source.served.kv_format.dtype == "bfloat16"
    pack = move_history(source, target, history)
    # an fp32 engine of the same weights refuses the pack: another fingerprint (the chain's root)
    fp32 = dataclasses.replace(
        source.served.kv_format, model_fingerprint=tiny.loaded.fingerprint, dtype="float32"
    )
    refused = decode_pack(fp32, pack)
    assert not refused.blocks and refused.reason is not None
    got, kept = moved_and_kept(source, target, history, turn, params)
    assert got.token_ids == kept.token_ids


def test_the_decode_kernel_reads_a_bf16_pool_as_its_widened_copy() -> None:
    if not paged_decode.available():
        pytest.skip("the CPU kernels do not build here")
    gen = torch.Generator().manual_seed(3)
    bs, nblocks, hkv, groups, d = 4, 10, 2, 3, 64
    pool = torch.randn(2, nblocks * bs, hkv, d, generator=gen).to(torch.bfloat16)
    blocks = torch.randperm(nblocks, generator=gen)[:6].view(2, 3)
    lens = torch.tensor([11, 6])
    query = torch.randn(2, hkv * groups, d, generator=gen)
    got, want = torch.empty_like(query), torch.empty_like(query)
    paged_decode.paged_decode(got, query, pool, blocks, lens, bs, d**-0.5)
    paged_decode.paged_decode(want, query, pool.float(), blocks, lens, bs, d**-0.5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # the same sums, vectorised apart
