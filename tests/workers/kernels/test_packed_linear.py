"""The CPU GEMMs of the model's linears (kvferry's own, oneDNN-packed): the engine really runs them,
outputs stay token-exact with HF generate (mixed prefill and decode steps, biases too, batches on
both sides of the kvferry GEMM's row limit), and where neither applies the model is left as it was."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from broker.sampling import SamplingParams
from tests.workers._helpers import NO_EOS, TinyModel, assert_tokens, make_engine, random_prompt, run_checked
from tests.workers.conftest import _build_tiny
from workers.engine.kernels import build, packed_linear
from workers.engine.kernels.packed_linear import (
    KVFERRY,
    ONEDNN,
    SKINNY_MAX_ROWS,
    PackedLinear,
    SkinnyLinear,
    pack_linears,
    supported,
)

pytestmark = pytest.mark.skipif(
    not supported(torch.device("cpu"), torch.float32), reason="this torch has no oneDNN packed linear"
)


def _linears(model: nn.Module) -> tuple[int, int]:
    plain = sum(1 for m in model.modules() if type(m) is nn.Linear)
    packed = sum(1 for m in model.modules() if isinstance(m, (PackedLinear, SkinnyLinear)))
    return plain, packed


@pytest.mark.parametrize("gemm", [KVFERRY, ONEDNN])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # qwen2: q/k/v projections carry a bias
def test_packed_engine_is_token_exact(tokenizer: object, arch: str, gemm: str) -> None:
    if not packed_linear._runs(gemm):
        pytest.skip(f"the {gemm} GEMM does not run here")
    tiny: TinyModel = _build_tiny(arch, tokenizer, seed=7)
    model = tiny.loaded.model
    total, _ = _linears(model)
    weights = tiny.loaded.weights_bytes
    assert pack_linears(model, (gemm,)) == total
    kind = SkinnyLinear if gemm == KVFERRY else PackedLinear
    assert all(isinstance(m, kind) for m in model.modules() if isinstance(m, (PackedLinear, SkinnyLinear)))
    # a budget above the kvferry GEMM's row limit: the first steps' prefill rows go to oneDNN
    engine = make_engine(
        tiny.loaded, num_blocks=64, block_size=8, max_num_batched_tokens=SKINNY_MAX_ROWS + 32
    )
    assert _linears(model) == (0, total), "every linear, lm_head included, runs packed"
    assert tiny.loaded.weights_bytes == weights, "packing neither loses nor doubles the weights"

    rng = random.Random(3)
    prompts = {f"r{i}": random_prompt(rng, n) for i, n in enumerate([3, 17, 40, 9, 61, 150])}
    params = SamplingParams(max_tokens=12, **NO_EOS)
    done = run_checked(engine, {rid: (p, params) for rid, p in prompts.items()})
    for rid, prompt in prompts.items():
        assert_tokens(done[rid].token_ids, tiny.expected(prompt, 12), f"{arch} {rid}")


def test_packing_off_or_unsupported_leaves_the_model_alone(tokenizer: object) -> None:
    tiny = _build_tiny("llama", tokenizer, seed=8)
    model = tiny.loaded.model
    total, _ = _linears(model)
    make_engine(tiny.loaded, num_blocks=16, block_size=8, packed_linear=False)
    assert _linears(model) == (total, 0)

    half = _build_tiny("llama", tokenizer, seed=8).loaded.model.to(torch.bfloat16)
    assert pack_linears(half) == 0 and _linears(half) == (total, 0)

    assert pack_linears(model) == total
    assert pack_linears(model) == 0, "a packed model is not packed again"
    x = torch.randn(2, 5, model.config.hidden_size)
    want = tiny.reference.model.model.layers[0].mlp.gate_proj(x)
    got = model.model.layers[0].mlp.gate_proj(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_kvferry_gemm_keeps_tied_weights_tied(tokenizer: object) -> None:
    """lm_head tied to the embeddings (SmolLM2) stays one tensor: no copy of the vocabulary."""
    if not build.built():
        pytest.skip("the CPU kernels did not build here")
    model = _build_tiny("llama", tokenizer, seed=9).loaded.model
    model.lm_head.weight = model.model.embed_tokens.weight
    assert pack_linears(model, (KVFERRY,)) > 0
    assert isinstance(model.lm_head, SkinnyLinear)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_a_layer_the_kvferry_gemm_cannot_read_as_is_goes_to_onednn(tokenizer: object) -> None:
    """A strided weight (a view of a larger tensor) would need a copy, which would untie it: that
    layer alone runs oneDNN-packed, and the model still answers like F.linear."""
    if not (build.built() and packed_linear._onednn_runs()):
        pytest.skip("needs both GEMMs")
    tiny = _build_tiny("llama", tokenizer, seed=10)
    model = tiny.loaded.model
    gate = model.model.layers[0].mlp.gate_proj
    wide = torch.randn(gate.out_features, 2 * gate.in_features)
    gate.weight = nn.Parameter(wide[:, ::2])
    x = torch.randn(2, 5, model.config.hidden_size)
    want = F.linear(x, gate.weight)
    total, _ = _linears(model)

    assert pack_linears(model, (KVFERRY,)) == total

    assert isinstance(model.model.layers[0].mlp.gate_proj, PackedLinear)
    assert isinstance(model.model.layers[0].mlp.up_proj, SkinnyLinear)
    with torch.inference_mode():
        torch.testing.assert_close(model.model.layers[0].mlp.gate_proj(x), want, rtol=1e-5, atol=1e-5)
