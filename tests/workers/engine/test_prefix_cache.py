"""Prefix-cache hits: exactly the expected number of tokens served from the pool, outputs unchanged."""

from __future__ import annotations

import random

import pytest

from broker.sampling import SamplingParams
from kvstore.pool.events import BlockEvent, BlockStored
from tests.workers._helpers import NO_EOS, TinyModel, assert_tokens, make_engine, random_prompt, run_checked
from workers.engine.requests.request import GenerationRequest

PARAMS = SamplingParams(max_tokens=12, **NO_EOS)


def test_shared_system_prompt_hits_its_blocks(tiny: TinyModel) -> None:
    rng = random.Random(10)
    system = random_prompt(rng, 64)
    tails = [random_prompt(rng, n) for n in (9, 5, 17, 40)]
    prompts = [system + tail for tail in tails]
    engine = make_engine(tiny.loaded, num_blocks=64)

    first = run_checked(engine, {"first": (prompts[0], PARAMS)})["first"]
    rest = run_checked(engine, {f"r{i}": (p, PARAMS) for i, p in enumerate(prompts[1:], 1)})

    assert first.cached_tokens == 0
    assert_tokens(first.token_ids, tiny.expected(prompts[0], 12), f"{len(prompts[0])} tokens, cold")
    for i, prompt in enumerate(prompts[1:], 1):
        out = rest[f"r{i}"]
        assert out.cached_tokens == 64, f"prompt of {len(prompt)} tokens hit {out.cached_tokens}, not 64"
        assert_tokens(out.token_ids, tiny.expected(prompt, 12), f"{len(prompt)} tokens, 64 cached")
    pool = engine.stats().pool
    assert pool.prefix_cache_queries_tokens == sum(len(p) for p in prompts)
    assert pool.prefix_cache_hits_tokens == 3 * 64
    assert engine.stats().prompt_tokens_computed == sum(len(p) for p in prompts) - 3 * 64


def test_concurrent_requests_share_the_same_prefix_blocks(tiny: TinyModel) -> None:
    """Requests admitted after the prefix is cached hold the very same block ids, with refcounts."""
    rng = random.Random(11)
    system = random_prompt(rng, 48)
    prompts = {f"r{i}": system + random_prompt(rng, 3 + i) for i in range(3)}
    engine = make_engine(tiny.loaded, num_blocks=32)
    run_checked(engine, {"warm": ([*system, 7], SamplingParams(max_tokens=1, **NO_EOS))})

    for rid, prompt in prompts.items():
        engine.add_request(GenerationRequest(rid, prompt, PARAMS))
    engine.step()
    engine.check_integrity()
    tables = [seq.block_ids[:3] for seq in engine.scheduler.running]
    assert len(tables) == 3 and tables[0] == tables[1] == tables[2], tables
    assert [engine.pool.blocks[b].ref_cnt for b in tables[0]] == [3, 3, 3]

    outs = run_checked(engine)
    for rid, prompt in prompts.items():
        assert outs[rid].cached_tokens == 48
        assert_tokens(outs[rid].token_ids, tiny.expected(prompt, 12), f"{rid}, {len(prompt)} tokens")


@pytest.mark.parametrize("length", [15, 16, 17, 31, 32, 33])
def test_block_boundary_lengths_cold_then_repeated(tiny: TinyModel, length: int) -> None:
    """The last prompt token is always recomputed (its logits pick the first output token), so a
    repeated prompt hits (length - 1) // 16 full blocks."""
    prompt = random_prompt(random.Random(100 + length), length)
    engine = make_engine(tiny.loaded, num_blocks=16)
    expected = tiny.expected(prompt, 12)

    cold = run_checked(engine, {"cold": (prompt, PARAMS)})["cold"]
    warm = run_checked(engine, {"warm": (prompt, PARAMS)})["warm"]

    assert cold.cached_tokens == 0
    assert_tokens(cold.token_ids, expected, f"{length}-token prompt, cold")
    assert warm.cached_tokens == (length - 1) // 16 * 16, f"{length}-token prompt"
    assert_tokens(warm.token_ids, expected, f"{length}-token prompt, {warm.cached_tokens} cached")


def test_follow_up_turn_hits_blocks_filled_during_decode(tiny: TinyModel) -> None:
    """A second turn (prompt + answer + more) reuses blocks that decoding filled and hashed."""
    rng = random.Random(12)
    prompt = random_prompt(rng, 20)
    engine = make_engine(tiny.loaded, num_blocks=32)
    stored: list[BlockEvent] = []
    engine.pool.subscribe(stored.append)

    answer = run_checked(engine, {"turn1": (prompt, SamplingParams(max_tokens=30, **NO_EOS))})["turn1"]
    follow_up = prompt + list(answer.token_ids) + random_prompt(rng, 6)
    turn2 = run_checked(engine, {"turn2": (follow_up, PARAMS)})["turn2"]

    # Turn 1 computed the prompt and all answer tokens but the last: (20 + 30 - 1) // 16 full blocks.
    assert sum(isinstance(e, BlockStored) for e in stored) >= 3
    assert_tokens(answer.token_ids, tiny.expected(prompt, 30), "turn 1")
    assert turn2.cached_tokens == 48
    assert_tokens(turn2.token_ids, tiny.expected(follow_up, 12), f"turn 2, {len(follow_up)} tokens")


def test_cache_salt_isolates_tenants(tiny: TinyModel) -> None:
    prompt = random_prompt(random.Random(13), 40)
    engine = make_engine(tiny.loaded, num_blocks=32)

    a = engine.generate([prompt], PARAMS, cache_salt="tenant-a")[0]
    b = engine.generate([prompt], PARAMS, cache_salt="tenant-b")[0]
    a_again = engine.generate([prompt], PARAMS, cache_salt="tenant-a")[0]

    assert (a.cached_tokens, b.cached_tokens, a_again.cached_tokens) == (0, 0, 32)
    for out in (a, b, a_again):
        assert_tokens(out.token_ids, tiny.expected(prompt, 12), f"salted, {out.cached_tokens} cached")
    engine.check_integrity()


def test_prompt_differing_inside_the_first_block_hits_nothing(tiny: TinyModel) -> None:
    rng = random.Random(14)
    prompt = random_prompt(rng, 40)
    other = list(prompt)
    other[5] = (other[5] + 1) % 49152  # the chained hashes differ from block 0 on
    engine = make_engine(tiny.loaded, num_blocks=32)

    run_checked(engine, {"a": (prompt, PARAMS)})
    out = run_checked(engine, {"b": (other, PARAMS)})["b"]

    assert out.cached_tokens == 0
    assert_tokens(out.token_ids, tiny.expected(other, 12), "one token changed in block 0")


def test_identical_prompts_in_one_step_compute_the_prefix_once(tiny: TinyModel) -> None:
    """The second of two identical prompts submitted together waits one step for the first's
    prefill to commit its blocks, then hits them instead of computing the same prefix in parallel,
    and copies the first's partial last block (all of it but its last token, always computed)."""
    prompt = random_prompt(random.Random(16), 37)
    engine = make_engine(tiny.loaded, num_blocks=16)
    stored: list[BlockEvent] = []
    engine.pool.subscribe(stored.append)

    twins = run_checked(engine, {"a": (prompt, PARAMS), "b": (prompt, PARAMS)})
    third = run_checked(engine, {"c": (prompt, PARAMS)})["c"]

    assert (twins["a"].cached_tokens, twins["b"].cached_tokens, third.cached_tokens) == (0, 36, 32)
    for out in (twins["a"], twins["b"], third):
        assert_tokens(out.token_ids, tiny.expected(prompt, 12), f"37 tokens, {out.cached_tokens} cached")
    hashes = [e.block_hash for e in stored if isinstance(e, BlockStored)]
    assert len(hashes) == len(set(hashes)), "a block was announced twice"
    assert engine.stats().prompt_tokens_computed == 37 + 1 + 5  # c: no running donor any more


def test_concurrent_shared_system_prompt_is_computed_once(tiny: TinyModel) -> None:
    """Cold cache, five requests at once sharing 64 tokens: one computes them, four hit them."""
    rng = random.Random(17)
    system = random_prompt(rng, 64)
    prompts = {f"r{i}": system + random_prompt(rng, 4 + 6 * i) for i in range(5)}
    engine = make_engine(tiny.loaded, num_blocks=64)

    outs = run_checked(engine, {rid: (p, PARAMS) for rid, p in prompts.items()})

    assert sorted(out.cached_tokens for out in outs.values()) == [0, 64, 64, 64, 64]
    for rid, prompt in prompts.items():
        assert_tokens(outs[rid].token_ids, tiny.expected(prompt, 12), f"{rid}, {len(prompt)} tokens")
    total = sum(len(p) for p in prompts.values())
    assert engine.stats().prompt_tokens_computed == total - 4 * 64
    assert engine.stats().pool.prefix_cache_hits_tokens == 4 * 64
