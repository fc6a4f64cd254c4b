"""What a prefetch reads from the Redis tier against what the turn uses (issue 43's realistic
workload read twice what its turns counted from Redis): a moved turn's tail costs one block, not
the pack of the blocks before it; a routing hint's prefetch and the turn's own, at once on one
worker, read the session's blocks once."""

# The Redis fixtures of tests/kvstore, imported: test arguments share their names.
# ruff: noqa: F811

from __future__ import annotations

import random
import threading
import time
from typing import Any

import redis

from kvstore.redis.tier import RedisTier
from kvstore.tiers.stored_block import StoredBlock
from ops.bench.engine.target import EngineTarget
from tests.kvstore.conftest import redis_client, redis_server  # noqa: F401
from tests.workers._helpers import TinyModel, make_engine, random_prompt
from tests.workers.tiers.test_moved_tail import _first_turn, _turn
from workers.tiers.prefetch import prefetch


def _counters(client: redis.Redis, tier: RedisTier) -> dict[str, int]:
    """The tier's shared counters (as every worker raises them)."""
    got: dict[bytes, bytes] = client.hgetall(tier.keys.counters)  # type: ignore[assignment]
    return {k.decode(): int(v) for k, v in got.items()} | {
        name: 0 for name in ("bytes_read_job", "blocks_fetched") if name.encode() not in got
    }


def test_a_tail_is_read_alone(tiny: TinyModel, redis_client: redis.Redis) -> None:
    """Turn 1 writes 4 full blocks and its tail; a worker the next turn moves to reads the 4 blocks,
    then the tail: the tail's read fetches one block (before: the pack it shared with the 4)."""
    rng = random.Random(44)
    history = random_prompt(rng, 70)  # with 5 output tokens: 4 full blocks and a tail of 10
    tier, output = _first_turn(tiny, redis_client, history)
    turn2 = [*history, *output, *random_prompt(rng, 7)]
    fresh = make_engine(tiny.loaded, num_blocks=16, warm_cache_size_bytes=1 << 20)
    assert prefetch(EngineTarget(fresh), tier, turn2, "", tails=True) == 4
    assert fresh.scheduler.blocks.tails.adopted == 1
    c = _counters(redis_client, tier)
    assert c["hits"] == 5  # the 4 blocks and the tail
    assert c["blocks_fetched"] == 5, c  # nothing fetched that the turn does not use
    assert c["bytes_read_tail"] < 2 * tier.stored_block_bytes, c


class _SlowTier(RedisTier):
    """A real Redis tier whose reads take `delay_s` longer (a busy machine's): long enough for the
    turn's own prefetch to start while a hint's read is on the wire."""

    delay_s = 0.5

    def get_run(self, *args: Any, **kwargs: Any) -> list[StoredBlock]:
        time.sleep(self.delay_s)
        return super().get_run(*args, **kwargs)


def test_a_hint_and_its_turn_read_the_blocks_once(tiny: TinyModel, redis_client: redis.Redis) -> None:
    rng = random.Random(45)
    history = random_prompt(rng, 70)
    written, output = _first_turn(tiny, redis_client, history)
    tier = _SlowTier(redis_client, written.fmt, 10**9)
    turn2 = [*history, *output, *random_prompt(rng, 7)]
    fresh = make_engine(tiny.loaded, num_blocks=16, warm_cache_size_bytes=1 << 20)
    target = EngineTarget(fresh)
    loaded: dict[str, int] = {}

    def fetch(cause: str) -> None:
        loaded[cause] = prefetch(target, tier, turn2, "", tails=True, cause=cause)

    hint = threading.Thread(target=fetch, args=("hint",))
    hint.start()
    time.sleep(0.1)  # the turn reaches the worker while the hint's read is on the wire
    fetch("job")
    hint.join(10)
    assert loaded == {"hint": 4, "job": 0}
    c = _counters(redis_client, tier)
    assert c["bytes_read_job"] == 0, c
    assert c["blocks_fetched"] == c["hits"] == 5, c
    out = _turn(fresh, "turn2", turn2)
    assert out.redis_tokens == out.cached_tokens > 0, out  # the hint's blocks served the turn
