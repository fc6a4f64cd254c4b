"""The fused decoder stack (kvferry::decoder_layers): the same logits and pool writes as the modules'
forward (decodes, prefill rows beside them, kvferry's GEMM, ATen's and oneDNN's), token-exact engines on
every architecture with it on and off, the steps it takes and leaves, and its refusals (raised
before anything is written)."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from broker.sampling import SamplingParams
from tests.workers._helpers import NO_EOS, TinyModel, assert_tokens, make_engine, random_prompt, run_checked
from tests.workers.conftest import _build_tiny
from workers.engine.kernels import paged_decode
from workers.engine.kernels.fused_crossover import FusedPlan
from workers.engine.kernels.fused_decoder import FusedDecoder
from workers.engine.kernels.packed_linear import SkinnyLinear
from workers.engine.llm_engine import LLMEngine
from workers.engine.requests.request import GenerationRequest

pytestmark = pytest.mark.skipif(
    not paged_decode.available(), reason="kvferry's CPU kernels did not build here"
)
ARCHS = ["llama", "qwen2", "qwen3", "mistral"]  # biases (qwen2, qwen3), q/k norms (qwen3)


def _count_fused(engine: LLMEngine, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each fused forward's number of rows, as they run."""
    fused = engine.executor.runner.fused
    assert fused is not None
    calls: list[int] = []
    forward = fused.forward

    def counted(input_ids: torch.Tensor, *args: Any) -> torch.Tensor:
        calls.append(int(input_ids.shape[0]))
        return forward(input_ids, *args)

    monkeypatch.setattr(fused, "forward", counted)
    return calls


def _skinny_rows(engine: LLMEngine, rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where kvferry's GEMM hands over to the large-batch one (measured at start-up), set by hand."""
    for module in engine.executor.runner.model.modules():
        if isinstance(module, SkinnyLinear):
            monkeypatch.setattr(module, "max_rows", rows)


def _mixed_batch(engine: LLMEngine, prompts: list[list[int]], late: list[int] | None) -> list[Any]:
    """A step's batch in which every sequence of `prompts` decodes (prefilled and sampled), and
    `late` (if any) prefills beside them."""
    for i, p in enumerate(prompts):
        engine.add_request(GenerationRequest(f"r{i}", p, SamplingParams(max_tokens=8, **NO_EOS)))
    while any(not s.output_token_ids for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    if late is not None:
        engine.add_request(GenerationRequest("late", late, SamplingParams(max_tokens=8, **NO_EOS)))
    step = engine.scheduler.schedule()
    assert sum(s.num_new_tokens > 1 for s in step.scheduled) == (late is not None)
    return list(step.scheduled)


def _fused_and_modules(
    engine: LLMEngine, batch: list[Any]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits, the modules' logits, the pool, the modules' pool) of one step of `batch`, run by the
    fused stack and by transformers' modules from the same pool; the step wrote its new K/V."""
    fused = engine.executor.runner.fused
    pool = engine.executor.kv_cache.tensor
    before = pool.clone()
    engine.executor.runner.fused = None
    want = engine.executor.runner.run(batch).sample
    want_pool = pool.clone()
    pool.copy_(before)
    engine.executor.runner.fused = fused
    got = engine.executor.runner.run(batch).sample
    assert not torch.equal(want_pool, before), "the step wrote its new K/V"
    return got, want, pool, want_pool


@pytest.mark.parametrize("gemm", ["kvferry", "aten", "onednn"])
@pytest.mark.parametrize("prefill", [False, True], ids=["decodes", "with-prefill"])
@pytest.mark.parametrize("arch", ARCHS)
def test_one_step_matches_the_modules_forward(
    tokenizer: object, arch: str, prefill: bool, gemm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Logits and every K/V written to the pool, against transformers' modules over the same
    kernels, from the same pool: ragged contexts, block edges, GQA, a prefill chunk (after a
    cached prefix) beside the decodes, and the linears on either GEMM."""
    tiny = _build_tiny(arch, tokenizer, seed=5)
    engine = make_engine(tiny.loaded, num_blocks=48, block_size=8)
    fused = engine.executor.runner.fused
    assert fused is not None, f"{arch}: the fused stack should apply"
    if gemm != "kvferry":
        _skinny_rows(engine, 2, monkeypatch)
        monkeypatch.setattr(fused, "plan", FusedPlan(onednn=gemm == "onednn", max_rows=None))
    rng = random.Random(1)
    prompts = [random_prompt(rng, n) for n in (1, 7, 8, 15, 40)]
    late = prompts[4][:19] + random_prompt(rng, 9) if prefill else None  # 16 of it cached, 12 new
    batch = _mixed_batch(engine, prompts, late)

    got, want, pool, want_pool = _fused_and_modules(engine, batch)

    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))
    torch.testing.assert_close(pool, want_pool, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "modules"])
@pytest.mark.parametrize("arch", ARCHS)
def test_engine_is_token_exact_with_the_stack_fused_or_not(
    tiny_model: Any, arch: str, fused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny: TinyModel = tiny_model(arch)
    engine = make_engine(tiny.loaded, num_blocks=96, fused_decode=fused)
    assert (engine.executor.runner.fused is not None) is fused
    if engine.executor.runner.fused is not None:  # whatever was measured here: every step fused
        monkeypatch.setattr(engine.executor.runner.fused, "plan", FusedPlan(onednn=False, max_rows=None))
    calls = _count_fused(engine, monkeypatch) if fused else []
    rng = random.Random(9)
    prompts = {f"r{i}": random_prompt(rng, n) for i, n in enumerate([2, 16, 17, 33, 64, 5])}
    params = SamplingParams(max_tokens=24, **NO_EOS)

    done = run_checked(engine, {rid: (p, params) for rid, p in prompts.items()})

    for rid, prompt in prompts.items():
        assert_tokens(done[rid].token_ids, tiny.expected(prompt, 24), f"{arch} {rid}, fused={fused}")
    if fused:
        rows = sum(len(p) for p in prompts.values())
        assert calls == [rows] + [len(prompts)] * 23, f"every step ran fused, the prefills too: {calls}"


def test_every_step_runs_fused_prefills_decodes_and_both_gemms(
    tiny: TinyModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prompts prefilled together, a long one chunked beside decodes, a cached prefix, decodes
    alone: every step runs fused, exact, with kvferry's GEMM below a lowered crossover and ATen's
    above it."""
    engine = make_engine(tiny.loaded, num_blocks=96, max_num_batched_tokens=64)
    _skinny_rows(engine, 8, monkeypatch)
    calls = _count_fused(engine, monkeypatch)
    rng = random.Random(4)
    short = {f"s{i}": random_prompt(rng, n) for i, n in enumerate([3, 20, 33])}
    long = short["s2"][:32] + random_prompt(rng, 150)  # 2 blocks of it cached
    params = SamplingParams(max_tokens=6, **NO_EOS)
    for rid, p in short.items():
        engine.add_request(GenerationRequest(rid, p, params))
    engine.step()
    engine.add_request(GenerationRequest("long", long, params))  # chunked beside 3 decodes
    done = run_checked(engine)

    assert calls[:2] == [56, 64], calls  # the short prompts; then 3 decodes + 61 of the long one
    assert len(calls) == engine.stats().num_steps, "every step ran fused"
    for rid, p in [*short.items(), ("long", long)]:
        assert_tokens(done[rid].token_ids, tiny.expected(p, 6), rid)


def test_it_applies_only_with_the_kernels_and_a_model_it_computes(
    tokenizer: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny = _build_tiny("llama", tokenizer, seed=2)
    assert make_engine(tiny.loaded, num_blocks=8, decode_kernel=False).executor.runner.fused is None
    assert make_engine(tiny.loaded, num_blocks=8, fused_decode=False).executor.runner.fused is None
    plain = _build_tiny("llama", tokenizer, seed=3)
    assert make_engine(plain.loaded, num_blocks=8, packed_linear=False).executor.runner.fused is None
    monkeypatch.setattr(tiny.loaded.model.config, "hidden_act", "gelu")
    assert make_engine(tiny.loaded, num_blocks=8).executor.runner.fused is None
    monkeypatch.setattr(tiny.loaded.model.config, "hidden_act", "silu")
    assert make_engine(tiny.loaded, num_blocks=8).executor.runner.fused is not None


def test_bad_tables_slots_or_weights_raise_before_anything_is_written(tiny: TinyModel) -> None:
    engine = make_engine(tiny.loaded, num_blocks=16, block_size=4)
    fused = engine.executor.runner.fused
    assert isinstance(fused, FusedDecoder)
    pool = engine.executor.kv_cache.tensor
    pool.normal_()
    before = pool.clone()
    # rows: a 2-token prefill chunk (positions 3, 4 of blocks [3, 7]), then a decode at position 0
    ids, pos = torch.tensor([5, 6, 7]), torch.tensor([3, 4, 0])
    blocks, lens = torch.tensor([[3, 7], [3, 7], [2, 0]]), torch.tensor([4, 5, 1])
    slots = torch.tensor([3 * 4 + 3, 7 * 4 + 0, 2 * 4 + 0])  # each context's last slot
    chunks = torch.tensor([2])
    fused.forward(ids, pos, slots, blocks, lens, chunks)  # well formed: runs
    assert not torch.equal(pool, before)
    pool.copy_(before)

    good = {"slots": slots, "blocks": blocks, "lens": lens, "chunks": chunks, "weights": fused.weights}
    cases: dict[str, dict[str, Any]] = {
        "a slot that is not its context's last": {"slots": slots + 1},
        "a block outside the pool": {"blocks": torch.tensor([[3, 16], [3, 16], [2, 0]])},
        "a context longer than its table": {"lens": torch.tensor([4, 9, 1])},
        "a chunk of two sequences": {"chunks": torch.tensor([3])},
        "a chunk past the step": {"chunks": torch.tensor([2, 2])},
        "a weight of another shape": {"weights": [*fused.weights[:-2], torch.zeros(3, 3), fused.weights[-1]]},
        "a weight missing": {"weights": fused.weights[:-1]},
    }
    for what, bad in cases.items():
        a = good | bad
        hidden = torch.ones(3, tiny.loaded.model.config.hidden_size)
        cos = sin = torch.zeros(3, pool.shape[-1])
        with pytest.raises(RuntimeError, match=r"decoder_layers|context length|block id"):
            torch.ops.kvferry.decoder_layers(
                hidden,
                cos,
                sin,
                pool,
                a["slots"],
                a["blocks"],
                a["lens"],
                a["chunks"],
                a["weights"],
                4,
                0.25,
                1e-6,
                16,
            )
        assert torch.equal(pool, before), f"{what}: the pool was written"
        assert torch.equal(hidden, torch.ones_like(hidden)), f"{what}: hidden was written"


@pytest.mark.parametrize("hkv, d", [(0, 16), (2, 0)], ids=["no-kv-heads", "no-head-dim"])
def test_a_pool_without_heads_or_head_dim_raises(tiny: TinyModel, hkv: int, d: int) -> None:
    """A malformed pool ([layers, 2, slots, Hkv, D] with Hkv or D zero) raises before the shapes
    are divided by them (never a division by zero)."""
    engine = make_engine(tiny.loaded, num_blocks=16, block_size=4)
    fused = engine.executor.runner.fused
    assert isinstance(fused, FusedDecoder)
    layers = engine.executor.kv_cache.tensor.shape[0]
    pool = torch.zeros(layers, 2, 16 * 4, hkv, d)
    one = torch.zeros(1, dtype=torch.long)
    with pytest.raises(RuntimeError, match="decoder_layers: kv must have"):
        torch.ops.kvferry.decoder_layers(
            torch.ones(1, tiny.loaded.model.config.hidden_size),
            torch.zeros(1, d),
            torch.zeros(1, d),
            pool,
            one,
            one[None],
            one + 1,
            torch.zeros(0, dtype=torch.long),
            fused.weights,
            4,
            0.25,
            1e-6,
            16,
        )
