"""Batch sizing (interactive_batch_step, workers/engine/scheduling/batch_budget.py): while interactive
requests flow, a step's batch rows are held to a predicted share of the step, the oldest batch
sequences first, at least one; with the interactive side quiet past the linger, batch sequences
fill the step again; outputs stay token-exact with HF generate. The row fit of the step cost
model (step_cost.py) recovers a step's fixed part and its cost per decode row."""

from __future__ import annotations

import random
import time

import pytest
import torch

from broker.sampling import SamplingParams
from tests.workers._helpers import TinyModel, assert_tokens, make_engine, random_prompt
from tests.workers.engine.test_admission_hold import Clock, PinnedCost
from workers.engine.llm_engine import LLMEngine
from workers.engine.requests.request import GenerationRequest
from workers.engine.scheduling.batch_budget import INTERACTIVE_LINGER_S
from workers.engine.scheduling.scheduler import SchedulerOutput
from workers.engine.scheduling.step_cost import StepCost

BASE_S, ROW_S, PREFILL_S = 0.010, 0.002, 0.001  # the pinned model: t = base + row * d + prefill * p
PARAMS = SamplingParams(max_tokens=10, ignore_eos=True)


def test_the_row_fit_recovers_base_and_row_cost() -> None:
    cost = StepCost()
    for d in (32, 32, 32):
        cost.record(d, 0, BASE_S + ROW_S * d)
    assert cost.decode_row_s == pytest.approx((BASE_S + ROW_S * 32) / 32)  # no spread: an upper bound
    for d in (1, 8, 32, 4):
        cost.record(d, 0, BASE_S + ROW_S * d)
    assert cost.decode_row_s == pytest.approx(ROW_S) and cost.decode_base_s == pytest.approx(BASE_S)
    for _ in range(80):  # d held steady: the last fit stays
        cost.record(6, 0, BASE_S + ROW_S * 6)
    assert cost.decode_row_s == pytest.approx(ROW_S)
    assert cost.predict_rows(5, 10) == pytest.approx(BASE_S + 5 * ROW_S + 10 * (cost.prefill_row_s or 0))


def _batch_decodes(step: SchedulerOutput) -> int:
    return sum(1 for s in step.scheduled if s.seq.is_batch and s.num_new_tokens == 1)


@pytest.mark.parametrize("factor", [2.0, 0.0])
def test_steps_carry_a_share_of_batch_rows_while_interactive_requests_flow(
    tiny: TinyModel, factor: float
) -> None:
    rng = random.Random(5)
    batch = {f"b{i}": random_prompt(rng, 5 + i) for i in range(10)}
    late = random_prompt(rng, 7)
    engine = make_engine(tiny.loaded, num_blocks=64, interactive_batch_step=factor)
    cost = PinnedCost(decode_s=BASE_S + ROW_S, prefill_row_s=PREFILL_S)
    cost.decode_base_s, cost.decode_row_s = BASE_S, ROW_S
    engine.scheduler.cost = cost
    clock = Clock()
    engine.scheduler.clock = clock
    done: dict[str, list[int]] = {}
    plans: list[SchedulerOutput] = []
    schedule = engine.scheduler.schedule

    def recording() -> SchedulerOutput:
        plans.append(schedule())
        return plans[-1]

    engine.scheduler.schedule = recording  # type: ignore[method-assign]

    def step() -> SchedulerOutput:
        for out in engine.step():
            if out.finished:
                done[out.request_id] = list(out.token_ids)
        engine.check_integrity()
        clock.now += 0.05
        return plans[-1]

    for rid, prompt in batch.items():
        engine.add_request(GenerationRequest(rid, prompt, PARAMS, job_class="batch"))
    step()  # the batch's prefill
    assert _batch_decodes(step()) == 10  # no interactive request: every batch sequence
    engine.add_request(GenerationRequest("i", late, PARAMS))
    first = step()
    assert [s.seq.request_id for s in first.scheduled] == ["i"]  # its prefill runs alone
    sized = step()
    # t(1 decode) = 12 ms; (2 - 1) x 12 ms of batch rows at 2 ms: 6 batch decodes, the oldest
    want = 6 if factor else 10
    assert _batch_decodes(sized) == want
    assert [s.seq.request_id for s in sized.scheduled if s.seq.is_batch] == list(batch)[:want]
    while "i" not in done:
        step()
    left = len([s for s in engine.scheduler.running if s.is_batch])
    assert _batch_decodes(step()) == min(want, left)  # it ended a moment ago: still sized
    clock.now += INTERACTIVE_LINGER_S
    while engine.has_unfinished():
        if len(done) < 11:
            n = len([s for s in engine.scheduler.running if s.is_batch])
            assert _batch_decodes(step()) == n  # quiet: every running batch sequence again
        else:
            step()
    for rid, prompt in {**batch, "i": late}.items():
        assert_tokens(done[rid], tiny.expected(prompt, 10), rid)


def test_interactive_traffic_elsewhere_in_the_fleet_sizes_the_batch_steps(tiny: TinyModel) -> None:
    """No interactive request here, but one flows on another worker (InteractivePresence sets
    elsewhere_until): the steps are sized as if it were here, and fill again once it is past."""
    rng = random.Random(7)
    engine = make_engine(tiny.loaded, num_blocks=64, interactive_batch_step=2.0)
    cost = PinnedCost(decode_s=BASE_S + ROW_S, prefill_row_s=PREFILL_S)
    cost.decode_base_s, cost.decode_row_s = BASE_S, ROW_S
    engine.scheduler.cost = cost
    clock = Clock()
    engine.scheduler.clock = clock
    for i in range(10):
        engine.add_request(GenerationRequest(f"b{i}", random_prompt(rng, 5 + i), PARAMS, job_class="batch"))
    engine.step()  # the batch's prefill
    clock.now += INTERACTIVE_LINGER_S  # past the batch's own arrival
    assert _batch_decodes(_step(engine)) == 10
    engine.scheduler.sizer.elsewhere_until = clock.now + 0.5
    assert _batch_decodes(_step(engine)) == 6  # (2 - 1) x t(1 decode) = 12 ms of 2 ms rows
    clock.now += 0.5
    assert _batch_decodes(_step(engine)) == 10


def _step(engine: LLMEngine) -> SchedulerOutput:
    plan = engine.scheduler.schedule
    seen: list[SchedulerOutput] = []

    def recording() -> SchedulerOutput:
        seen.append(plan())
        return seen[-1]

    engine.scheduler.schedule = recording  # type: ignore[method-assign]
    try:
        engine.step()
    finally:
        del engine.scheduler.schedule
    return seen[-1]


def test_a_one_thread_cpu_engine_times_its_steps_on_its_threads_cpu_clock(tiny: TinyModel) -> None:
    """A busy machine's wait for a core is not a step's cost (step_cost.py): a CPU engine on one
    torch thread times steps with time.thread_time, any other with the wall clock."""
    threads = torch.get_num_threads()
    try:
        assert make_engine(tiny.loaded, 8, torch_threads=1).scheduler.cost.clock is time.thread_time
        assert make_engine(tiny.loaded, 8, torch_threads=2).scheduler.cost.clock is time.perf_counter
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("duty", [0.5, 1.0])
def test_a_gap_follows_only_batch_only_steps_while_interactive_traffic_flows(
    tiny: TinyModel, duty: float
) -> None:
    """batch_pause_s after each step: step seconds x (1 / duty - 1) for a step of batch rows alone
    while traffic flows; 0 for a step with an interactive row, once the traffic is past, or at duty 1."""
    rng = random.Random(9)
    engine = make_engine(tiny.loaded, num_blocks=64, interactive_batch_duty=duty)
    ticks = iter(range(10_000))
    engine.scheduler.cost.clock = lambda: next(ticks) * 0.01  # each step: 10 ms on the cost clock
    clock = Clock()
    engine.scheduler.clock = clock
    for i in range(4):
        engine.add_request(GenerationRequest(f"b{i}", random_prompt(rng, 6 + i), PARAMS, job_class="batch"))
    engine.step()
    assert engine.batch_pause_s == 0.0  # nothing interactive has been seen
    engine.scheduler.sizer.elsewhere_until = clock.now + 10
    engine.step()
    assert engine.batch_pause_s == pytest.approx(0.01 * (1 / duty - 1))
    engine.add_request(GenerationRequest("i", random_prompt(rng, 5), PARAMS))
    engine.step()
    assert engine.batch_pause_s == 0.0  # the interactive prompt's step
    engine.step()
    assert engine.batch_pause_s == 0.0  # its decode rides with the batch rows
    engine.scheduler.sizer.elsewhere_until = float("-inf")
    while engine.has_unfinished():
        engine.step()
        clock.now += INTERACTIVE_LINGER_S
    assert engine.batch_pause_s == 0.0  # past the linger: no gap
