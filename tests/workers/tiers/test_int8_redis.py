"""An int8 KV pool through a real Redis (issue 41): blocks staged out of the int8 pool by the
writer, stored exact with their scales, prefetched by a fresh engine, give the tokens of the same
turn on the engine that kept them; a lossy tier form over an int8 pool is refused."""

# The Redis fixtures of tests/kvstore, imported: test arguments share their names.
# ruff: noqa: F811

from __future__ import annotations

import random

import pytest
import redis

from broker.sampling import SamplingParams
from kvstore.redis.tier import RedisTier
from ops.bench.engine.target import EngineTarget
from tests.kvstore.conftest import redis_client, redis_server  # noqa: F401
from tests.workers._helpers import NO_EOS, TinyModel, make_engine, random_prompt, run_checked
from workers.tiers.prefetch import prefetch
from workers.tiers.writer import KVWriter


def test_an_int8_turn_resumed_from_redis_gives_the_tokens_of_a_kept_one(
    tiny: TinyModel, redis_client: redis.Redis
) -> None:
    rng = random.Random(33)
    history = random_prompt(rng, 70)  # 4 full blocks and a partial one
    params = SamplingParams(max_tokens=10, **NO_EOS)
    first = make_engine(tiny.loaded, num_blocks=16, warm_cache_size_bytes=1 << 20, kv_cache_dtype="int8")
    assert first.tiers is not None and first.served.kv_format.dtype == "int8"
    tier = RedisTier(redis_client, first.served.kv_format, 10**9)
    writer = KVWriter(tier)
    first.tiers.attach(writer)
    out = run_checked(first, {"turn1": (history, params)})["turn1"]
    turn2 = [*history, *out.token_ids, *random_prompt(rng, 7)]
    for i in range(3):  # the first turn's blocks leave the pool: spilled to Redis
        run_checked(first, {f"filler{i}": (random_prompt(rng, 60), SamplingParams(max_tokens=2, **NO_EOS))})
    assert writer.flush(30)
    writer.stop()
    tier.check_integrity()

    fresh = make_engine(tiny.loaded, num_blocks=16, warm_cache_size_bytes=1 << 20, kv_cache_dtype="int8")
    assert prefetch(EngineTarget(fresh), tier, turn2, "") >= 4
    resumed = run_checked(fresh, {"turn2": (turn2, params)})["turn2"]
    keeping = make_engine(tiny.loaded, num_blocks=32, kv_cache_dtype="int8")
    run_checked(keeping, {"turn1": (history, params)})
    kept = run_checked(keeping, {"turn2": (turn2, params)})["turn2"]
    assert resumed.redis_tokens >= 64 and kept.pool_tokens >= 64
    assert resumed.token_ids == kept.token_ids
    # an fp32 engine of the same weights finds none of it: another chain root, another tier
    fp32 = make_engine(tiny.loaded, num_blocks=16, warm_cache_size_bytes=1 << 20)
    assert prefetch(EngineTarget(fp32), tier, turn2, "") == 0
    with pytest.raises(ValueError, match="stored exact"):
        RedisTier(redis_client, first.served.kv_format, 10**9, tier_dtype="fp16")
