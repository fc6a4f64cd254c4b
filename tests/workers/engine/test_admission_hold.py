"""The admission hold (prefill_batch_hold): while others decode, new prompts wait and are then
prefilled together in one step, once the oldest's predicted TTFT would pass the bound (or when
nothing decodes any more); the decode steps in between carry no prefill, and outputs stay
token-exact with HF generate. The step cost is pinned and the clock is the test's, so the steps
are exact."""

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


def _engine(tiny: TinyModel, hold: float) -> tuple[LLMEngine, Clock, list[SchedulerOutput]]:
    engine = make_engine(tiny.loaded, num_blocks=64, prefill_batch_hold=hold)
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
    engine, clock, steps = _engine(tiny, hold=5.0)
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

    # Bound: 5 x a 6-prompt batch's prefill (0.01 + 6 x 16.5 rows x 0.001 s), about 0.55 s; n0's
    # TTFT so far: its wait, one more step, the 33 rows' prefill. Past it, both go in together.
    clock.now += 0.5
    _step(engine, outs)
    assert steps[-1].num_decodes == 4
    assert steps[-1].num_prefill_tokens == len(late["n0"]) + len(late["n1"])
    _drain(engine, outs)

    for rid, prompt in {**running, **late}.items():
        assert_tokens(outs[rid], tiny.expected(prompt, 30), rid)
    assert engine.pool.stats().blocks_used == 0


def test_held_prompts_go_in_once_nothing_decodes(tiny: TinyModel) -> None:
    rng = random.Random(22)
    engine, _, steps = _engine(tiny, hold=10.0)
    outs: dict[str, list[int]] = {}
    for i in range(2):
        engine.add_request(f"r{i}", random_prompt(rng, 8), SamplingParams(max_tokens=4, ignore_eos=True))
    _step(engine, outs)
    late = random_prompt(rng, 9)
    engine.add_request("n0", late, SamplingParams(max_tokens=6, ignore_eos=True))
    _drain(engine, outs)
    assert engine.scheduler.num_held_steps == 3  # r0 and r1's three decode steps
    assert [s.num_prefill_tokens for s in steps] == [16, 0, 0, 0, 9, 0, 0, 0, 0, 0]
    assert_tokens(outs["n0"], tiny.expected(late, 6), "n0")


@pytest.mark.parametrize("hold", [0.0, 5.0])
def test_off_or_unmeasured_admits_at_once(tiny: TinyModel, hold: float) -> None:
    rng = random.Random(23)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    engine, _, steps = _engine(tiny, hold=hold)
    if hold:
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
    assert Settings.from_env({}, prefill_batch_hold=1.5).engine_config().prefill_batch_hold == 1.5
    with pytest.raises(ValueError, match="prefill_batch_hold"):
        EngineConfig(prefill_batch_hold=-1.0)
