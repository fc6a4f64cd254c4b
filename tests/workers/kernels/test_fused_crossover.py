"""fused_crossover: the fused stack's large-batch GEMM (ATen's or oneDNN's) and its row limit come
from timings on this machine (here a scripted timer), measured once per process and shape, and the
engine's steps follow them."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
import torch
from torch import nn

from broker.sampling import SamplingParams
from tests.workers._helpers import NO_EOS, TinyModel, assert_tokens, make_engine, random_prompt, run_checked
from workers.engine.kernels import fused_crossover, packed_linear, paged_decode
from workers.engine.kernels.fused_crossover import FusedPlan, Gemm
from workers.engine.kernels.packed_linear import SkinnyLinear


def _linears(onednn: bool = True) -> list[SkinnyLinear]:
    out = [SkinnyLinear(nn.Linear(8, 4)), SkinnyLinear(nn.Linear(4, 8, bias=False))]
    for m in out:
        m._onednn = onednn
    return out


def _scripted(
    aten_ms: dict[int, float], onednn_ms: float = 10.0, timed: list[int] | None = None
) -> fused_crossover.Timer:
    """A timer: ATen's GEMM takes aten_ms[rows], oneDNN's always onednn_ms."""

    def timer(gemms: Sequence[Gemm], linears: Sequence[SkinnyLinear], rows: int) -> list[float]:
        assert list(gemms) == [fused_crossover.aten, fused_crossover.onednn], "raced together"
        if timed is not None:
            timed.append(rows)
        return [1e-3 * aten_ms[rows], 1e-3 * onednn_ms]

    return timer


@pytest.mark.parametrize(
    "aten_ms, plan, timed",
    [
        ({128: 12.0, 256: 9.0}, FusedPlan(onednn=True, max_rows=None), [128]),  # oneDNN from the first
        ({128: 8.0, 256: 9.0, 512: 11.0}, FusedPlan(onednn=False, max_rows=256), [128, 256, 512]),
        ({128: 8.0, 256: 9.0, 512: 10.0}, FusedPlan(onednn=False, max_rows=None), [128, 256, 512]),
    ],
    ids=["onednn-faster", "aten-then-onednn", "aten-throughout"],
)
def test_the_plan_is_made_from_the_timings(
    aten_ms: dict[int, float], plan: FusedPlan, timed: list[int]
) -> None:
    seen: list[int] = []
    assert fused_crossover.measure(_linears(), (128, 256, 512), _scripted(aten_ms, timed=seen)) == plan
    assert seen == timed, "the first count where ATen falls behind ends the search"


def test_without_onednn_or_its_op_the_stack_keeps_aten_with_no_limit() -> None:
    def never(gemms: Sequence[Gemm], linears: Sequence[SkinnyLinear], rows: int) -> list[float]:
        raise AssertionError("nothing to time without oneDNN")

    assert fused_crossover.measure(_linears(onednn=False), timer=never) == FusedPlan(False, None)

    def missing(gemms: Sequence[Gemm], linears: Sequence[SkinnyLinear], rows: int) -> list[float]:
        raise RuntimeError("no such op")

    assert fused_crossover.measure(_linears(), timer=missing) == FusedPlan(False, None)


def test_the_real_timer_runs_both_gemms_and_the_plan_is_cached_per_shape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fused_crossover, "_plans", {})
    linears = _linears(onednn=torch.backends.mkldnn.is_available())
    assert all(t > 0 for t in fused_crossover.race((fused_crossover.aten,), linears, 16))
    first = fused_crossover.plan(linears)
    monkeypatch.setattr(fused_crossover, "measure", lambda _: pytest.fail("measured twice"))
    assert fused_crossover.plan(_linears(onednn=linears[0]._onednn)) is first  # same shapes: cached


@pytest.mark.skipif(
    not (paged_decode.available() and packed_linear._onednn_runs()),
    reason="no kvferry kernels or oneDNN here",
)
@pytest.mark.parametrize("aten_ms", [{128: 12.0}, {128: 8.0, 256: 11.0}], ids=["onednn", "aten-up-to-128"])
def test_the_engine_follows_the_measured_plan(
    tiny: TinyModel, aten_ms: dict[int, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan measured when the engine is built (oneDNN's GEMM in the stack; or ATen's, with a
    step over 128 rows left to the modules), exact either way."""
    monkeypatch.setattr(fused_crossover, "_plans", {})
    monkeypatch.setattr(fused_crossover, "race", _scripted(aten_ms))
    engine = make_engine(tiny.loaded, num_blocks=96)
    fused = engine.executor.runner.fused
    assert fused is not None
    want = FusedPlan(True, None) if aten_ms[128] > 10 else FusedPlan(False, 128)
    assert fused.plan == want
    for module in engine.executor.runner.model.modules():  # ATen's or oneDNN's GEMM above 2 rows
        if isinstance(module, SkinnyLinear):
            monkeypatch.setattr(module, "max_rows", 2)
    rows: list[int] = []
    forward = fused.forward

    def counted(input_ids: torch.Tensor, *args: torch.Tensor) -> torch.Tensor:
        rows.append(int(input_ids.shape[0]))
        return forward(input_ids, *args)

    monkeypatch.setattr(fused, "forward", counted)
    rng = random.Random(3)
    prompts = {f"r{i}": random_prompt(rng, n) for i, n in enumerate([70, 75])}
    params = SamplingParams(max_tokens=4, **NO_EOS)
    done = run_checked(engine, {rid: (p, params) for rid, p in prompts.items()})
    for rid, prompt in prompts.items():
        assert_tokens(done[rid].token_ids, tiny.expected(prompt, 4), rid)
    assert rows == ([145] if want.max_rows is None else []) + [2, 2, 2], rows
