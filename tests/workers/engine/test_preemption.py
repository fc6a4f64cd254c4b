"""A pool too small for the load: eviction and preemption by recompute keep outputs exact."""

from __future__ import annotations

import random

import pytest

from broker.sampling import SamplingParams
from kvstore.pool.events import BlockEvent, BlockRemoved
from tests.workers._helpers import NO_EOS, TinyModel, assert_tokens, make_engine, random_prompt, run_checked


@pytest.mark.parametrize("caching", [True, False])
def test_small_pool_preempts_evicts_and_stays_exact(tiny: TinyModel, caching: bool) -> None:
    rng = random.Random(20)
    system = random_prompt(rng, 16)
    # Six requests of up to 5 blocks each (prompt + 40 tokens) on a 10-block pool.
    prompts = {f"r{i}": system + random_prompt(rng, n) for i, n in enumerate((4, 20, 9, 25, 14, 2))}
    engine = make_engine(tiny.loaded, num_blocks=10, enable_prefix_caching=caching)
    events: list[BlockEvent] = []
    engine.pool.subscribe(events.append)
    params = SamplingParams(max_tokens=40, **NO_EOS)

    outs = run_checked(engine, {rid: (p, params) for rid, p in prompts.items()})

    for rid, prompt in prompts.items():
        assert outs[rid].finish_reason == "length"
        assert_tokens(outs[rid].token_ids, tiny.expected(prompt, 40), f"{rid}, {len(prompt)} tokens")
    stats = engine.stats()
    assert stats.num_preemptions > 0, f"the pool never ran out: {stats}"
    assert stats.pool.blocks_peak_used == 10
    if caching:
        assert any(isinstance(e, BlockRemoved) for e in events), "no cached block was ever evicted"
        assert stats.pool.prefix_cache_hits_tokens > 0
    else:
        assert events == []


def test_preempted_sampling_request_keeps_its_seeded_stream(tiny: TinyModel) -> None:
    """Recompute after preemption must not redraw tokens: the seeded stream matches a roomy pool."""
    rng = random.Random(21)
    prompts = {f"r{i}": random_prompt(rng, 10 + 7 * i) for i in range(4)}
    params = {
        rid: SamplingParams(max_tokens=40, temperature=1.0, seed=i, **NO_EOS) for i, rid in enumerate(prompts)
    }

    roomy = run_checked(
        make_engine(tiny.loaded, num_blocks=64), {r: (prompts[r], params[r]) for r in prompts}
    )
    tight_engine = make_engine(tiny.loaded, num_blocks=8)
    tight = run_checked(tight_engine, {r: (prompts[r], params[r]) for r in prompts})

    assert tight_engine.stats().num_preemptions > 0
    for rid in prompts:
        assert_tokens(tight[rid].token_ids, roomy[rid].token_ids, f"{rid}, seeded, preempted vs not")


def test_request_outgrowing_the_whole_pool_finishes_with_length(tiny: TinyModel) -> None:
    """A 4-block pool holds 64 tokens: a 30-token prompt asking for 100 more stops when the pool is
    full, with the exact tokens up to that point, and frees everything."""
    prompt = random_prompt(random.Random(22), 30)
    engine = make_engine(tiny.loaded, num_blocks=4)

    out = run_checked(engine, {"big": (prompt, SamplingParams(max_tokens=100, **NO_EOS))})["big"]

    assert out.finish_reason == "length"
    assert len(out.token_ids) == 64 - 30 + 1  # the token sampled at position 63 is still returned
    assert_tokens(out.token_ids, tiny.expected(prompt, 100)[: len(out.token_ids)], "30 tokens, 4 blocks")
