"""Job classes in the engine (workers/engine/scheduling/scheduler.py, wait_queue.py): interactive requests
are admitted before batch ones, lower priority first; a waiting interactive request takes a seat
or pool room from the newest running batch sequence; a step that prefills an interactive prompt
carries no batch work; and every output stays token-exact with HF generate."""

from __future__ import annotations

import random

from broker.priority import JobClass
from broker.sampling import SamplingParams
from tests.workers._helpers import NO_EOS, TinyModel, assert_tokens, make_engine, random_prompt, run_checked
from workers.engine.llm_engine import LLMEngine
from workers.engine.requests.output import RequestOutput
from workers.engine.requests.request import GenerationRequest
from workers.engine.requests.sequence import EngineRequest
from workers.engine.scheduling.scheduler import SchedulerOutput
from workers.engine.scheduling.wait_queue import WaitQueue

PARAMS = SamplingParams(max_tokens=12, **NO_EOS)


def _seq(rid: str, job_class: JobClass = "interactive", priority: int = 0) -> EngineRequest:
    return EngineRequest(rid, [1, 2], PARAMS, 12, job_class=job_class, priority=priority)


def test_the_waiting_order() -> None:
    queue = WaitQueue()
    seqs = {
        "i0": _seq("i0"),
        "b0": _seq("b0", "batch"),
        "i-1": _seq("i-1", priority=-1),
        "b-5": _seq("b-5", "batch", -5),
        "i0'": _seq("i0'"),
        "i9": _seq("i9", priority=9),
    }
    for seq in seqs.values():
        queue.add(seq)
    assert [s.request_id for s in queue] == ["i-1", "i0", "i0'", "i9", "b-5", "b0"]
    back = _seq("b0 preempted", "batch")
    queue.put_back(back)  # ahead of its rank, behind every better one
    assert [s.request_id for s in queue][4:] == ["b-5", "b0 preempted", "b0"]
    queue.put_back_all([_seq("d1"), _seq("d2")])
    assert [s.request_id for s in queue][:3] == ["i-1", "d1", "d2"]


def test_one_class_is_a_fifo_with_a_front() -> None:
    queue = WaitQueue()
    for i in range(5):
        queue.add(_seq(f"r{i}"))
    queue.put_back(_seq("p"))
    assert [s.request_id for s in queue] == ["p", "r0", "r1", "r2", "r3", "r4"]
    assert queue.popleft().request_id == "p" and len(queue) == 5


def _record(engine: LLMEngine) -> list[SchedulerOutput]:
    steps: list[SchedulerOutput] = []
    schedule = engine.scheduler.schedule

    def recording() -> SchedulerOutput:
        out = schedule()
        steps.append(out)
        return out

    engine.scheduler.schedule = recording  # type: ignore[method-assign]
    return steps


def _add(engine: LLMEngine, rid: str, prompt: list[int], job_class: JobClass, priority: int = 0) -> None:
    engine.add_request(GenerationRequest(rid, prompt, PARAMS, job_class=job_class, priority=priority))


def _collect(outs: list[RequestOutput], done: dict[str, list[int]]) -> None:
    for out in outs:
        if out.finished:
            done[out.request_id] = list(out.token_ids)


def _step_until(engine: LLMEngine, done: dict[str, list[int]], pred: object, limit: int = 200) -> None:
    for _ in range(limit):
        if callable(pred) and pred():
            return
        for out in engine.step():
            if out.finished:
                done[out.request_id] = list(out.token_ids)
    raise AssertionError("never reached")


def _finish(engine: LLMEngine, done: dict[str, list[int]]) -> None:
    for _ in range(2000):
        if not engine.has_unfinished():
            return
        for out in engine.step():
            if out.finished:
                done[out.request_id] = list(out.token_ids)
        engine.check_integrity()
    raise AssertionError("unfinished")


def test_interactive_first_then_priority(tiny: TinyModel) -> None:
    rng = random.Random(3)
    prompts = {rid: random_prompt(rng, 9) for rid in ("b", "i+1", "i-1")}
    engine = make_engine(tiny.loaded, num_blocks=32, max_num_seqs=1)
    steps = _record(engine)
    _add(engine, "b", prompts["b"], "batch", -100)
    _add(engine, "i+1", prompts["i+1"], "interactive", 1)
    _add(engine, "i-1", prompts["i-1"], "interactive", -1)
    done: dict[str, list[int]] = {}
    _finish(engine, done)
    firsts: list[str] = []
    for step in steps:
        for s in step.scheduled:
            if s.seq.request_id not in firsts:
                firsts.append(s.seq.request_id)
    assert firsts == ["i-1", "i+1", "b"]
    for rid, prompt in prompts.items():
        assert_tokens(done[rid], tiny.expected(prompt, 12), rid)


def test_an_interactive_request_takes_the_newest_batch_seat(tiny: TinyModel) -> None:
    rng = random.Random(4)
    prompts = {rid: random_prompt(rng, 10 + i) for i, rid in enumerate(("b1", "b2", "i"))}
    engine = make_engine(tiny.loaded, num_blocks=32, max_num_seqs=2)
    steps = _record(engine)
    done: dict[str, list[int]] = {}
    _add(engine, "b1", prompts["b1"], "batch")
    _add(engine, "b2", prompts["b2"], "batch")
    _step_until(engine, done, lambda: len(steps) >= 3)  # both decode by now
    _add(engine, "i", prompts["i"], "interactive")
    engine.step()
    seat = steps[-1]
    assert [s.request_id for s in seat.preempted] == ["b2"]  # the newest batch sequence yields
    assert [s.seq.request_id for s in seat.scheduled] == ["i"]  # and its prefill runs alone
    engine.step()
    assert {s.seq.request_id for s in steps[-1].scheduled} == {"i", "b1"}  # b1 decodes again
    _finish(engine, done)
    for rid, prompt in prompts.items():
        assert_tokens(done[rid], tiny.expected(prompt, 12), rid)


def test_an_interactive_request_takes_pool_room_from_batch(tiny: TinyModel) -> None:
    rng = random.Random(5)
    prompts = {"b1": random_prompt(rng, 40), "b2": random_prompt(rng, 40), "i": random_prompt(rng, 60)}
    engine = make_engine(tiny.loaded, num_blocks=8, max_num_seqs=8, enable_prefix_caching=False)
    steps = _record(engine)
    done: dict[str, list[int]] = {}
    _add(engine, "b1", prompts["b1"], "batch")
    _add(engine, "b2", prompts["b2"], "batch")
    _step_until(engine, done, lambda: len(engine.scheduler.running) == 2 and len(steps) >= 2)
    _add(engine, "i", prompts["i"], "interactive")
    engine.step()
    assert steps[-1].preempted and all(s.is_batch for s in steps[-1].preempted)
    assert "i" in {s.seq.request_id for s in steps[-1].scheduled}
    _finish(engine, done)
    for rid, prompt in prompts.items():
        assert_tokens(done[rid], tiny.expected(prompt, 12), rid)


def test_no_batch_work_beside_an_interactive_prefill_and_all_exact(tiny: TinyModel) -> None:
    rng = random.Random(6)
    batch = {f"b{i}": random_prompt(rng, 8 + 3 * i) for i in range(4)}
    interactive = {f"i{i}": random_prompt(rng, 20 + 5 * i) for i in range(3)}
    engine = make_engine(tiny.loaded, num_blocks=64, max_num_seqs=8, max_num_batched_tokens=32)
    seen: list[tuple[bool, bool, bool]] = []  # per step: prefills an interactive, has batch, batch runs
    schedule = engine.scheduler.schedule

    def recording() -> SchedulerOutput:
        out = schedule()
        prefills = any(
            not s.seq.is_batch and s.seq.num_computed_tokens < s.seq.num_prompt_tokens for s in out.scheduled
        )
        running_batch = any(s.is_batch for s in engine.scheduler.running)
        seen.append((prefills, any(s.seq.is_batch for s in out.scheduled), running_batch))
        return out

    engine.scheduler.schedule = recording  # type: ignore[method-assign]
    done: dict[str, list[int]] = {}
    for rid, prompt in batch.items():
        _add(engine, rid, prompt, "batch")
    for i, (rid, prompt) in enumerate(interactive.items()):
        for _ in range(2 + i):
            _collect(engine.step(), done)
        _add(engine, rid, prompt, "interactive")
    _finish(engine, done)
    assert not [i for i, (prefills, has_batch, _) in enumerate(seen) if prefills and has_batch]
    assert any(prefills and running for prefills, _, running in seen), "no batch work ever waited"
    for rid, prompt in {**batch, **interactive}.items():
        assert_tokens(done[rid], tiny.expected(prompt, 12), rid)


def test_all_interactive_is_unchanged(tiny: TinyModel) -> None:
    """With one class the engine schedules as before: same steps as a plain run (all priority 0)."""
    rng = random.Random(7)
    prompts = {f"r{i}": random_prompt(rng, 10 + 4 * i) for i in range(5)}
    params = SamplingParams(max_tokens=12, **NO_EOS)
    outs = run_checked(make_engine(tiny.loaded, num_blocks=10), {r: (p, params) for r, p in prompts.items()})
    for rid, prompt in prompts.items():
        assert_tokens(outs[rid].token_ids, tiny.expected(prompt, 12), rid)
