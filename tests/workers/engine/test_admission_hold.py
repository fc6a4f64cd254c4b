"""The admission hold (prefill_batch_ttft_s): while others decode, new prompts wait and are then
prefilled together in one step, once the oldest's predicted TTFT would pass the budget (or as
many wait as decode); the decode steps in between carry no prefill, and outputs stay token-exact
with HF generate. The step cost is pinned and the clock is the test's, so the steps are exact."""

from __future__ import annotations

import random

import pytest

from broker.sampling import SamplingParams
from ops.settings import Settings
from tests.workers._helpers import TinyModel, assert_tokens, make_engine, random_prompt
from workers.engine.config import EngineConfig
from workers.engine.llm_engine import LLMEngine
from workers.engine.scheduler import SchedulerOutput
from workers.engine.step_cost import StepCost

DECODE_S, ROW_S = 0.01, 0.001  # the pinned cost model: a decode step, one prefill row


class PinnedCost(StepCost):
    def record(self, num_decodes: int, num_prefill: int, seconds: float) -> None:
        pass  # the test's figures, not this machine's


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _engine(tiny: TinyModel, budget_s: float) -> tuple[LLMEngine, Clock, list[SchedulerOutput]]:
    engine = make_engine(tiny.loaded, num_blocks=64, prefill_batch_ttft_s=budget_s)
    engine.scheduler.cost = PinnedCost(decode_s=DECODE_S, prefill_row_s=ROW_S)
    clock = Clock()
    engine.scheduler.clock = clock
    steps: list[SchedulerOutput] = []
    schedule = engine.scheduler.schedule

    def recording() -> SchedulerOutput:
        out = schedule()
        steps.append(out)
        clock.now += DECODE_S
        return out

    engine.scheduler.schedule = recording  # type: ignore[method-assign]
    return engine, clock, steps


def _drain(engine: LLMEngine, outs: dict[str, list[int]]) -> None:
    while engine.has_unfinished():
        for out in engine.step():
            outs[out.request_id] = list(out.token_ids)


def _step(engine: LLMEngine, outs: dict[str, list[int]]) -> None:
    for out in engine.step():
        outs[out.request_id] = list(out.token_ids)


def test_held_arrivals_are_prefilled_together_and_outputs_exact(tiny: TinyModel) -> None:
    rng = random.Random(21)
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    running = {f"r{i}": random_prompt(rng, 6 + i) for i in range(4)}
    late = {"n0": random_prompt(rng, 20), "n1": random_prompt(rng, 13)}
    engine, clock, steps = _engine(tiny, budget_s=0.5)
    outs: dict[str, list[int]] = {}
    for rid, prompt in running.items():
        engine.add_request(rid, prompt, params)
    _step(engine, outs)  # their prefill: nothing decodes yet, so nothing is held
    engine.add_request("n0", late["n0"], params)
    for _ in range(5):
        _step(engine, outs)
    engine.add_request("n1", late["n1"], params)
    for _ in range(5):
        _step(engine, outs)
    held = steps[1:]
    assert all(s.num_decodes == 4 and s.num_prefill_tokens == 0 for s in held), held
    assert engine.scheduler.num_held_steps == len(held)

    clock.now += 0.5  # n0 has waited past the budget: both go in the next step, together
    _step(engine, outs)
    assert steps[-1].num_decodes == 4
    assert steps[-1].num_prefill_tokens == len(late["n0"]) + len(late["n1"])
    _drain(engine, outs)

    for rid, prompt in {**running, **late}.items():
        assert_tokens(outs[rid], tiny.expected(prompt, 30), rid)
    assert engine.pool.stats().blocks_used == 0


def test_no_hold_once_as_many_wait_as_decode(tiny: TinyModel) -> None:
    rng = random.Random(22)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    engine, _, steps = _engine(tiny, budget_s=5.0)
    outs: dict[str, list[int]] = {}
    for i in range(2):
        engine.add_request(f"r{i}", random_prompt(rng, 8), params)
    _step(engine, outs)
    engine.add_request("n0", random_prompt(rng, 9), params)
    _step(engine, outs)
    assert steps[-1].num_prefill_tokens == 0  # one waits, two decode: held
    engine.add_request("n1", random_prompt(rng, 10), params)
    _step(engine, outs)
    assert steps[-1].num_prefill_tokens == 19  # two wait, two decode: both go in
    _drain(engine, outs)
    assert engine.scheduler.num_held_steps == 1


@pytest.mark.parametrize("budget_s", [0.0, 0.5])
def test_off_or_unmeasured_admits_at_once(tiny: TinyModel, budget_s: float) -> None:
    rng = random.Random(23)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    engine, _, steps = _engine(tiny, budget_s=budget_s)
    if budget_s:
        engine.scheduler.cost = StepCost()  # nothing timed yet: no hold
    outs: dict[str, list[int]] = {}
    for i in range(3):
        engine.add_request(f"r{i}", random_prompt(rng, 8), params)
    _step(engine, outs)
    engine.add_request("n0", random_prompt(rng, 9), params)
    _step(engine, outs)
    assert steps[-1].num_prefill_tokens == 9 and engine.scheduler.num_held_steps == 0


def test_step_cost_follows_timed_steps() -> None:
    cost = StepCost()
    cost.record(4, 0, 0.05)
    assert not cost.ready
    cost.record(4, 100, 0.15)
    assert cost.ready and cost.prefill_row_s == pytest.approx(0.001)
    assert cost.predict(50) == pytest.approx(0.1)
    cost.record(4, 0, 0.10)  # the machine slowed: the average moves toward it
    assert 0.05 < (cost.decode_s or 0) < 0.10
    assert cost.seconds_decode_only == pytest.approx(0.15)
    assert cost.seconds_with_prefill == pytest.approx(0.15)


def test_the_budget_is_a_setting_and_validated() -> None:
    assert Settings.from_env({}, prefill_batch_ttft_s=0.8).engine_config().prefill_batch_ttft_s == 0.8
    with pytest.raises(ValueError, match="prefill_batch_ttft_s"):
        EngineConfig(prefill_batch_ttft_s=-1.0)
