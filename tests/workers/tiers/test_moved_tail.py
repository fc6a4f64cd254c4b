"""A session turn's partial last block travels through the Redis tier (kvstore/tiers/tail.py): the
turn's worker writes it through with the turn's blocks, a fresh engine's prefetch (the worker the
next turn moves to) keeps it as its own kept tail, and the next turn computes only its new tokens,
token-exact vs HF generate; its tokens count as Redis's."""

# The Redis fixtures of tests/kvstore, imported: test arguments share their names.
# ruff: noqa: F811

from __future__ import annotations

import random

import redis

from broker.sampling import SamplingParams
from kvstore.redis.tier import RedisTier
from ops.bench.engine.target import EngineTarget
from tests.kvstore.conftest import redis_client, redis_server  # noqa: F401
from tests.workers._helpers import NO_EOS, TinyModel, assert_tokens, make_engine, random_prompt
from workers.engine.llm_engine import LLMEngine
from workers.engine.requests.output import RequestOutput
from workers.engine.requests.request import GenerationRequest
from workers.tiers.prefetch import prefetch
from workers.tiers.writer import KVWriter

PARAMS = SamplingParams(max_tokens=5, **NO_EOS)


def _turn(engine: LLMEngine, request_id: str, prompt: list[int]) -> RequestOutput:
    """A session turn (its tail kept), stepped by hand, the engine's invariants checked each step."""
    engine.add_request(GenerationRequest(request_id, prompt, PARAMS, keep_tail=True))
    final = None
    while engine.has_unfinished():
        final = next((o for o in engine.step() if o.finished), final)
        engine.check_integrity()
    assert final is not None
    return final


def _first_turn(tiny: TinyModel, client: redis.Redis, history: list[int]) -> tuple[RedisTier, list[int]]:
    """The session's turn on one engine, written through to a real Redis tier; its output."""
    first = make_engine(tiny.loaded, num_blocks=16, warm_cache_size_bytes=1 << 20)
    assert first.tiers is not None
    tier = RedisTier(client, first.served.kv_format, 10**9)
    writer = KVWriter(tier)
    first.tiers.attach(writer)
    out = _turn(first, "turn1", history)
    assert_tokens(out.token_ids, tiny.expected(history, 5), "turn 1")
    assert writer.flush(30)
    writer.stop()
    tier.check_integrity()
    return tier, list(out.token_ids)


def _moved(tiny: TinyModel, tier: RedisTier, turn2: list[int], tails: bool) -> tuple[LLMEngine, int]:
    """Turn 2 on a fresh engine after its prefetch; the prompt tokens it computed."""
    fresh = make_engine(tiny.loaded, num_blocks=16, warm_cache_size_bytes=1 << 20)
    assert prefetch(EngineTarget(fresh), tier, turn2, "", tails=tails) == 4
    out = _turn(fresh, "turn2", turn2)
    assert_tokens(out.token_ids, tiny.expected(turn2, 5), f"turn 2 moved (tails {tails})")
    assert out.redis_tokens == out.cached_tokens and out.pool_tokens == 0, out
    return fresh, out.computed_prompt_tokens


def test_a_moved_turn_computes_only_its_new_tokens(tiny: TinyModel, redis_client: redis.Redis) -> None:
    rng = random.Random(42)
    history = random_prompt(rng, 70)  # with 5 output tokens: 74 computed, 4 full blocks and 10 more
    tier, output = _first_turn(tiny, redis_client, history)
    new = random_prompt(rng, 7)
    turn2 = [*history, *output, *new]
    fresh, computed = _moved(tiny, tier, turn2, tails=True)
    # The previous turn's last output token has no KV yet: it is computed with the new ones.
    assert computed == len(new) + 1
    assert fresh.scheduler.blocks.tails.adopted == 1
    # Without the tail, its 10 tokens are computed again (what a moved turn cost before).
    _, without = _moved(tiny, tier, turn2, tails=False)
    assert without == len(new) + 1 + 10


def test_a_tail_kept_here_is_not_fetched_again(tiny: TinyModel, redis_client: redis.Redis) -> None:
    rng = random.Random(43)
    history = random_prompt(rng, 70)
    tier, output = _first_turn(tiny, redis_client, history)
    turn2 = [*history, *output, *random_prompt(rng, 7)]
    fresh = make_engine(tiny.loaded, num_blocks=16, warm_cache_size_bytes=1 << 20)
    target = EngineTarget(fresh)
    assert prefetch(target, tier, turn2, "", tails=True) == 4
    read = tier.stats().blocks_read
    assert prefetch(target, tier, turn2, "", tails=True) == 0
    assert tier.stats().blocks_read == read  # resident: the blocks and the tail are not read again
    assert fresh.scheduler.blocks.tails.adopted == 1
