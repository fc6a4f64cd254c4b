"""Kept tails: a finished session turn's partial last block stays in the pool, and the next turn,
whose prompt starts with exactly those tokens, writes on into it: every computed token of the
last turn is a hit. Outputs stay token-exact; tails give way to any allocation."""

from __future__ import annotations

import random

from broker.sampling import SamplingParams
from tests.workers._helpers import TinyModel, assert_tokens, make_engine, random_prompt
from workers.engine.llm_engine import LLMEngine
from workers.engine.requests.output import RequestOutput
from workers.engine.requests.request import GenerationRequest

PARAMS = SamplingParams(max_tokens=7, ignore_eos=True)


def _run(engine: LLMEngine, request_id: str, prompt: list[int], keep: bool = True) -> RequestOutput:
    engine.add_request(GenerationRequest(request_id, prompt, PARAMS, keep_tail=keep))
    final = None
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                final = out
        engine.check_integrity()
    assert final is not None
    return final


def test_next_turn_writes_on_into_the_kept_tail(tiny: TinyModel) -> None:
    rng = random.Random(3)
    engine = make_engine(tiny.loaded, num_blocks=32)
    turn1 = random_prompt(rng, 40)
    r1 = _run(engine, "t1", turn1)
    assert_tokens(r1.token_ids, tiny.expected(turn1, 7), "turn 1")
    # 46 tokens computed (the last output token never is): 2 full blocks and a tail of 14, kept.
    assert len(engine.scheduler.blocks.tails) == 1 and engine.pool.stats().blocks_used == 1
    tail_id = next(iter(engine.scheduler.blocks.tails._tails.values()))[0].block_id

    turn2 = [*turn1, *r1.token_ids, *random_prompt(rng, 10)]
    engine.add_request(GenerationRequest("t2", turn2, PARAMS, keep_tail=True))
    engine.step()
    seq = engine.scheduler.running[0]
    assert seq.block_ids[2] == tail_id and engine.pool.blocks[tail_id].ref_cnt == 1
    while engine.has_unfinished():
        for out in engine.step():
            r2 = out
        engine.check_integrity()
    assert r2.cached_tokens == 46 and r2.pool_tokens == 46, r2
    assert_tokens(r2.token_ids, tiny.expected(turn2, 7), "turn 2 on the kept tail")
    assert engine.scheduler.blocks.tails.taken == 1 and len(engine.scheduler.blocks.tails) == 1


def test_other_tokens_at_the_tail_miss_it_and_unwanted_requests_keep_none(tiny: TinyModel) -> None:
    rng = random.Random(4)
    engine = make_engine(tiny.loaded, num_blocks=32)
    turn1 = random_prompt(rng, 40)
    r1 = _run(engine, "t1", turn1)
    edited = [*turn1[:35], 7, *turn1[36:], *r1.token_ids, 5, 6]  # differs inside the tail
    r2 = _run(engine, "t2", edited, keep=False)
    assert r2.cached_tokens == 32, r2
    assert_tokens(r2.token_ids, tiny.expected(edited, 7), "edited history")
    assert engine.scheduler.blocks.tails.taken == 0
    engine.scheduler.blocks.tails.clear()
    _run(engine, "plain", random_prompt(rng, 40), keep=False)
    assert engine.pool.stats().blocks_used == 0 and not engine.scheduler.blocks.tails


def test_tails_give_way_to_allocations_and_to_a_reset(tiny: TinyModel) -> None:
    rng = random.Random(5)
    engine = make_engine(tiny.loaded, num_blocks=8)
    for i in range(2):
        _run(engine, f"s{i}", random_prompt(rng, 20))
    assert len(engine.scheduler.blocks.tails) == 1  # at most num_blocks // 8 of them
    big = random_prompt(rng, 8 * 16 - 7)  # needs every block of the pool
    out = _run(engine, "big", big, keep=False)
    assert_tokens(out.token_ids, tiny.expected(big, 7), "a prompt filling the pool")
    assert not engine.scheduler.blocks.tails and engine.scheduler.blocks.tails.dropped == 2
    _run(engine, "again", random_prompt(rng, 20))
    assert len(engine.scheduler.blocks.tails) == 1
    engine.abort_all()
    assert not engine.scheduler.blocks.tails and engine.pool.stats().blocks_used == 0
    engine.check_integrity()
