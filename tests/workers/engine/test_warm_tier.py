"""A small hot pool plus a host-memory warm tier: blocks evicted from the pool come back from the
warm tier instead of being recomputed, and outputs stay token-exact."""

from __future__ import annotations

import random

from broker.sampling import SamplingParams
from kvstore.chain import hash_blocks
from kvstore.tiers.stored_block import StoredBlock
from tests.workers._helpers import NO_EOS, TinyModel, assert_tokens, make_engine, random_prompt, run_checked
from workers.engine.kernels import block_writer


def test_evicted_blocks_come_back_from_the_warm_tier_exactly(tiny: TinyModel) -> None:
    rng = random.Random(21)
    system = random_prompt(rng, 64)  # 4 full blocks
    first = [*system, *random_prompt(rng, 9)]
    filler = [random_prompt(rng, 70) for _ in range(3)]
    again = [*system, *random_prompt(rng, 11)]
    params = SamplingParams(max_tokens=6, **NO_EOS)
    engine = make_engine(tiny.loaded, num_blocks=8, warm_cache_size_bytes=1 << 20)
    assert engine.tiers is not None
    # where the CPU kernels build, the reload below goes through the streaming loader
    assert (engine.executor.kv_cache.block_writer is not None) == block_writer.available()

    out = run_checked(engine, {"first": (first, params)})["first"]
    assert_tokens(out.token_ids, tiny.expected(first, 6), "first")
    for i, prompt in enumerate(filler):  # each fills the 8-block pool: the system prompt is evicted
        run_checked(engine, {f"filler{i}": (prompt, params)})
    assert engine.tiers.spilled_blocks >= 4
    first_hash = hash_blocks(system[:16], 16, (), parent=engine.scheduler.blocks.root(""))[0]
    assert engine.pool.get_cached_block(first_hash, system[:16]) is None, "the pool still holds the prefix"

    out = run_checked(engine, {"again": (again, params)})["again"]
    assert_tokens(out.token_ids, tiny.expected(again, 6), "after reload from the warm tier")
    assert out.pool_tokens == 0 and out.warm_tokens == 64 and out.cached_tokens == 64
    assert out.computed_prompt_tokens == len(again) - 64


def test_small_pool_plus_warm_tier_computes_less_than_small_pool_alone(tiny: TinyModel) -> None:
    rng = random.Random(22)
    systems = [random_prompt(rng, 48) for _ in range(3)]
    workload = [[*systems[i % 3], *random_prompt(rng, 5)] for i in range(12)]
    params = SamplingParams(max_tokens=4, **NO_EOS)
    computed = {}
    for warm in (0, 1 << 20):
        engine = make_engine(tiny.loaded, num_blocks=6, warm_cache_size_bytes=warm)
        for i, prompt in enumerate(workload):
            out = run_checked(engine, {f"r{i}": (prompt, params)})[f"r{i}"]
            assert_tokens(out.token_ids, tiny.expected(prompt, 4), f"request {i} (warm={warm})")
        computed[warm] = engine.stats().prompt_tokens_computed
    assert computed[1 << 20] < computed[0] * 0.6, computed


def test_a_block_back_in_the_pool_leaves_the_warm_tier_and_returns_when_evicted(tiny: TinyModel) -> None:
    rng = random.Random(23)
    system = random_prompt(rng, 64)
    params = SamplingParams(max_tokens=4, **NO_EOS)
    engine = make_engine(tiny.loaded, num_blocks=8, warm_cache_size_bytes=1 << 20)
    assert engine.tiers is not None
    hashes = hash_blocks(system, 16, (), parent=engine.scheduler.blocks.root(""))
    run_checked(engine, {"first": ([*system, 1, 2], params)})
    assert not any(h in engine.tiers.warm for h in hashes), (
        "computed blocks are warm while the pool holds them"
    )
    for i in range(2):
        run_checked(engine, {f"filler{i}": (random_prompt(rng, 100), params)})
    assert all(h in engine.tiers.warm for h in hashes), "evicted blocks did not go warm"

    again = [*system, 3, 4, 5]
    out = run_checked(engine, {"again": (again, params)})["again"]
    assert_tokens(out.token_ids, tiny.expected(again, 4), "after reload from the warm tier")
    assert out.warm_tokens == 64
    assert not any(h in engine.tiers.warm for h in hashes), "the warm tier keeps a copy of pool blocks"
    run_checked(engine, {"filler2": (random_prompt(rng, 100), params)})
    in_pool = [
        engine.pool.get_cached_block(h, system[i * 16 : (i + 1) * 16]) is not None
        for i, h in enumerate(hashes)
    ]
    in_warm = [h in engine.tiers.warm for h in hashes]
    assert any(in_warm), "blocks evicted a second time did not go warm"
    assert [p != w for p, w in zip(in_pool, in_warm, strict=True)] == [True] * 4, (in_pool, in_warm)


def test_sessions_outgrowing_the_pool_keep_their_history_in_pool_plus_warm(tiny: TinyModel) -> None:
    """Round-robin sessions whose histories fit the pool and the warm tier together, not either
    alone: after its first turn, a session computes only what is new (no history is lost)."""
    rng = random.Random(24)
    params = SamplingParams(max_tokens=6, **NO_EOS)
    per_block = 8 * 1024  # the tiny models' 16-token block (tests/workers/conftest.py)
    engine = make_engine(tiny.loaded, num_blocks=10, warm_cache_size_bytes=18 * per_block)
    histories = [random_prompt(rng, 40) for _ in range(5)]
    lost = 0
    for turn in range(4):
        for s, history in enumerate(histories):
            prompt = [*history, *random_prompt(rng, 5)]
            out = run_checked(engine, {f"s{s}t{turn}": (prompt, params)})[f"s{s}t{turn}"]
            assert_tokens(out.token_ids, tiny.expected(prompt, 6), f"session {s} turn {turn}")
            if turn:  # every full block of what the last turn computed (its last token never is)
                lost += (len(history) - 1) // 16 * 16 - out.cached_tokens
            histories[s] = [*prompt, *out.token_ids]
    assert lost == 0, f"{lost} history tokens recomputed"


def test_a_prefetched_block_the_pool_holds_does_not_go_warm(tiny: TinyModel) -> None:
    rng = random.Random(25)
    prompt = random_prompt(rng, 40)
    engine = make_engine(tiny.loaded, num_blocks=8, warm_cache_size_bytes=1 << 20)
    assert engine.tiers is not None
    run_checked(engine, {"first": (prompt, SamplingParams(max_tokens=2, **NO_EOS))})
    root = engine.scheduler.blocks.root("")
    first, second = hash_blocks(prompt[:32], 16, (), parent=root)
    late = StoredBlock(
        first, root, tuple(prompt[:16]), engine.executor.kv_cache.read_block(0)
    )  # a racing prefetch
    fresh = StoredBlock(hash_blocks([7] * 16, 16, (), parent=second)[0], second, (7,) * 16, late.kv)
    engine.admit_prefetched([late, fresh])
    assert first not in engine.tiers.warm, "a block the pool holds was duplicated in the warm tier"
    assert fresh.block_hash in engine.tiers.warm
