"""The admission hold (prefill_batch_hold): while others decode, new prompts wait and are then
prefilled together in one step, once the oldest's predicted TTFT would pass the bound (or when
nothing decodes any more); the decode steps in between carry no prefill, and outputs stay
token-exact with HF generate. The step cost is pinned and the clock is the test's, so the steps
are exact. A waiting prompt counts only the tokens it will compute: a prefix cached in the pool
or the warm tier is left out (a copy, not a compute), and looking it up changes nothing."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest

import workers.engine.block_manager as block_manager
from broker.defaults import DEFAULTS
from broker.sampling import SamplingParams
from kvstore.chain import BlockHash
from ops.settings import Settings
from tests.workers._helpers import TinyModel, assert_tokens, make_engine, random_prompt, run_checked
from workers.engine.config import EngineConfig
from workers.engine.llm_engine import LLMEngine
from workers.engine.requests.output import RequestOutput
from workers.engine.requests.request import GenerationRequest
from workers.engine.requests.sequence import EngineRequest
from workers.engine.scheduling.scheduler import SchedulerOutput
from workers.engine.scheduling.step_cost import StepCost

DECODE_S, ROW_S = 0.01, 0.001  # the pinned cost model: a decode step, one prefill row


class PinnedCost(StepCost):
    def record(self, num_decodes: int, num_prefill: int, seconds: float) -> None:
        pass  # the test's figures, not this machine's


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _engine(
    tiny: TinyModel, hold: float, num_blocks: int = 64, **config: Any
) -> tuple[LLMEngine, Clock, list[SchedulerOutput]]:
    engine = make_engine(tiny.loaded, num_blocks=num_blocks, prefill_batch_hold=hold, **config)
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
        engine.add_request(GenerationRequest(rid, prompt, params))
    _step(engine, outs)  # their prefill: nothing decodes yet, so nothing is held
    engine.add_request(GenerationRequest("n0", late["n0"], params))
    for _ in range(5):
        _step(engine, outs)
    engine.add_request(GenerationRequest("n1", late["n1"], params))
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
        engine.add_request(
            GenerationRequest(f"r{i}", random_prompt(rng, 8), SamplingParams(max_tokens=4, ignore_eos=True))
        )
    _step(engine, outs)
    late = random_prompt(rng, 9)
    engine.add_request(GenerationRequest("n0", late, SamplingParams(max_tokens=6, ignore_eos=True)))
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
        engine.add_request(GenerationRequest(f"r{i}", random_prompt(rng, 8), params))
    _step(engine, outs)
    engine.add_request(GenerationRequest("n0", random_prompt(rng, 9), params))
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


def _finals(engine: LLMEngine, finals: dict[str, RequestOutput], steps: int | None = None) -> None:
    """Step until nothing is unfinished (or `steps` times), keeping each request's final output."""
    n = 0
    while engine.has_unfinished() and (steps is None or n < steps):
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
        n += 1


HISTORY = random_prompt(random.Random(31), 64)  # a session's history: 4 full blocks
NEW = random_prompt(random.Random(32), 6)  # the next turn's new tokens


@pytest.mark.parametrize("source", ["cold", "pool", "warm"])
def test_a_prompt_whose_prefix_is_cached_is_not_held_like_a_cold_one(
    tiny: TinyModel, source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One sequence decodes; a 70-token prompt arrives. Cold, it computes 70 rows: held (its TTFT
    2 x 0.01 + 70 x 0.001 s stays under one 2-prompt batch's prefill, 0.01 + 140 x 0.001 s). Its
    first 64 tokens cached, in the pool or the warm tier, it computes 6: let in at once (2 x 0.01
    + 6 x 0.001 s is past 0.01 + 12 x 0.001 s). Before, both counted all 70 and were held."""
    engine, _, steps = _engine(tiny, hold=1.0, num_blocks=12, warm_cache_size_bytes=1 << 20)
    assert engine.tiers is not None
    finals: dict[str, RequestOutput] = {}
    once = SamplingParams(max_tokens=1, ignore_eos=True)
    engine.add_request(GenerationRequest("history", HISTORY, once))
    _finals(engine, finals)
    if source == "warm":  # a 12-block filler evicts the history's blocks into the warm tier
        engine.add_request(GenerationRequest("filler", random_prompt(random.Random(33), 180), once))
        _finals(engine, finals)
        root = engine.scheduler.blocks.root("")
        assert (
            engine.pool.get_cached_block(
                block_manager.hash_blocks(HISTORY[:16], 16, (), root)[0], HISTORY[:16]
            )
            is None
        )
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    running = random_prompt(random.Random(34), 6)
    engine.add_request(GenerationRequest("r0", running, params))
    _finals(engine, finals, steps=1)  # its prefill: nothing decodes yet, so nothing is held

    hashed: list[int] = []
    real_hash_blocks = block_manager.hash_blocks

    def counting(tokens: Sequence[int], *args: Any, **kw: Any) -> list[BlockHash]:
        hashed.append(len(tokens))
        return real_hash_blocks(tokens, *args, **kw)

    monkeypatch.setattr(block_manager, "hash_blocks", counting)
    prompt = random_prompt(random.Random(35), 70) if source == "cold" else [*HISTORY, *NEW]
    engine.add_request(GenerationRequest("turn", prompt, params))
    _finals(engine, finals, steps=3)
    held = source == "cold"
    assert engine.scheduler.num_held_steps == (3 if held else 0)
    assert [s.num_prefill_tokens for s in steps[-3:]] == ([0, 0, 0] if held else [6, 0, 0])
    _finals(engine, finals)

    assert sum(hashed) == 64, "the waiting prompt was hashed more than once"
    for rid, p in {"r0": running, "turn": prompt}.items():
        assert_tokens(list(finals[rid].token_ids), tiny.expected(p, 12), rid)
    turn = finals["turn"]
    assert (turn.pool_tokens, turn.warm_tokens) == {"cold": (0, 0), "pool": (64, 0), "warm": (0, 64)}[source]


def test_counting_uncached_tokens_changes_nothing(tiny: TinyModel) -> None:
    """A prompt whose prefix is half in the pool, half in the warm tier: the count is what its
    admission then computes, and counting moves no block in either LRU order, takes no
    reference and counts no prefix query nor warm-tier hit or miss."""
    engine = make_engine(tiny.loaded, num_blocks=8, warm_cache_size_bytes=1 << 20)
    assert engine.tiers is not None
    once = SamplingParams(max_tokens=1, ignore_eos=True)
    # The history's 4 blocks go to the free queue's tail, its last block nearest the head; a 6-block
    # filler takes the 4 never-used blocks and the history's last 2, which go warm.
    run_checked(engine, {"history": (HISTORY, once)})
    run_checked(engine, {"filler": (random_prompt(random.Random(36), 90), once)})
    hashes = block_manager.hash_blocks(HISTORY, 16, (), engine.scheduler.blocks.root(""))
    assert [h in engine.tiers.warm for h in hashes] == [False, False, True, True]
    seq = EngineRequest("turn", [*HISTORY, *NEW], SamplingParams(max_tokens=4, ignore_eos=True), 4)
    pool, warm = engine.pool, engine.tiers.warm

    def state() -> tuple[object, ...]:
        return (
            [b.block_id for b in pool._free],
            [b.ref_cnt for b in pool.blocks],
            pool.stats(),
            list(warm._blocks),
            warm.stats(),
            len(engine.scheduler.blocks.tails),
        )

    before = state()
    assert engine.scheduler.hold.uncached_tokens(seq) == len(NEW)
    assert engine.scheduler.hold.uncached_tokens(seq) == len(NEW)
    assert state() == before

    engine.add_request(GenerationRequest("turn", seq.prompt_token_ids, seq.params))
    outs = run_checked(engine)
    assert engine.stats().prompt_tokens_computed == 64 + 90 + len(NEW)
    assert (outs["turn"].pool_tokens, outs["turn"].warm_tokens) == (32, 32)
    assert_tokens(list(outs["turn"].token_ids), tiny.expected(seq.prompt_token_ids, 4), "turn")


def test_the_count_leaves_out_a_kept_tail_and_a_running_neighbours_partial_block(tiny: TinyModel) -> None:
    """Tokens a kept tail or a running sequence's partial block gives (allocate's, uncomputed) are
    not counted either; neither is taken by counting."""
    rng = random.Random(37)
    engine = make_engine(tiny.loaded, num_blocks=32)
    hold, params = engine.scheduler.hold, SamplingParams(max_tokens=7, ignore_eos=True)
    turn1 = random_prompt(rng, 40)
    engine.add_request(GenerationRequest("t1", turn1, params, keep_tail=True))
    finals: dict[str, RequestOutput] = {}
    _finals(engine, finals)  # 46 tokens computed: 2 full blocks and a tail of 14, kept
    turn2 = [*turn1, *finals["t1"].token_ids, *random_prompt(rng, 10)]
    assert hold.uncached_tokens(EngineRequest("t2", turn2, params, 7)) == len(turn2) - 46
    assert len(engine.scheduler.blocks.tails) == 1 and engine.scheduler.blocks.tails.taken == 0
    before = engine.stats().prompt_tokens_computed
    engine.add_request(GenerationRequest("t2", turn2, params))
    _finals(engine, finals)
    assert_tokens(list(finals["t2"].token_ids), tiny.expected(turn2, 7), "t2")
    assert engine.stats().prompt_tokens_computed - before == len(turn2) - 46  # what admission computed

    prompt = random_prompt(rng, 37)  # 2 full blocks and 5 tokens, 4 of which a neighbour holds
    engine.add_request(GenerationRequest("first", prompt, params))
    for _ in range(2):
        engine.step()
    later = EngineRequest("later", prompt, params, 7)
    assert hold.uncached_tokens(later) == 5  # no running sequence offered
    assert hold.uncached_tokens(later, engine.scheduler.running) == 1


def test_the_budget_is_a_setting_and_validated() -> None:
    assert DEFAULTS.prefill_batch_hold == 0.0 and EngineConfig().prefill_batch_hold == 0.0  # off
    assert Settings.from_env({}, prefill_batch_hold=1.5).engine_config().prefill_batch_hold == 1.5
    with pytest.raises(ValueError, match="prefill_batch_hold"):
        EngineConfig(prefill_batch_hold=-1.0)
