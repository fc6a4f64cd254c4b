"""The KV writer yields the cores to a busy engine (workers/tiers/writer_yield.py): writes wait while the
engine steps, up to the deferral, and never while the queue fills, someone flushes, or it stops."""

# ruff: noqa: F811

from __future__ import annotations

import random
import threading
import time

import pytest
import redis

from broker.sampling import SamplingParams
from kvstore.redis.tier import RedisTier
from ops.bench.engine.target import EngineTarget
from tests.kvstore.conftest import MakeBlocks, make_blocks, redis_client, redis_server  # noqa: F401
from tests.workers._helpers import NO_EOS, TinyModel, assert_tokens, make_engine, random_prompt, run_checked
from tests.workers.tiers.test_kv_writer import BLOCK, FMT
from workers.engine.errors import EngineFailedError
from workers.engine.requests.request import GenerationRequest
from workers.loop.engine_loop import EngineLoop
from workers.loop.idle_event import IdleEvent
from workers.tiers.prefetch import prefetch
from workers.tiers.writer import KVWriter
from workers.tiers.writer_yield import QUIET_S, EngineYield


def _busy_writer(client: redis.Redis, defer_s: float, queue_blocks: int = 64) -> tuple[KVWriter, RedisTier]:
    tier = RedisTier(client, FMT, 10**9)
    writer = KVWriter(tier, max_queued_bytes=queue_blocks * BLOCK, defer_s=defer_s)
    writer.yielding.idle = IdleEvent()  # clear: the engine is stepping
    assert writer.ready.wait(30)  # timings below count from a writer that takes writes at once
    return writer, tier


def _written(tier: RedisTier, blocks: list) -> int:  # type: ignore[type-arg]
    return tier.contains_run([b.block_hash for b in blocks])


def _wait_written(tier: RedisTier, blocks: list, timeout_s: float) -> float:  # type: ignore[type-arg]
    """Seconds until every block is in the tier (fails after timeout_s)."""
    started = time.monotonic()
    while _written(tier, blocks) < len(blocks):
        assert time.monotonic() - started < timeout_s, "the write never landed"
        time.sleep(0.01)
    return time.monotonic() - started


def test_wait_returns_on_idle_deadline_or_hurry() -> None:
    idle = IdleEvent()
    gate = EngineYield(defer_s=5.0, idle=idle)
    started = time.monotonic()
    gate.wait(time.monotonic() + 0.2, lambda: False)  # never idle: the deadline ends it
    assert 0.15 < time.monotonic() - started < 2
    started = time.monotonic()
    gate.wait(time.monotonic() + 5, lambda: True)  # hurried: no wait at all
    assert time.monotonic() - started < 0.1
    started = time.monotonic()
    threading.Timer(0.1, idle.set).start()
    gate.wait(time.monotonic() + 5, lambda: False)  # the engine goes idle, and stays so QUIET_S
    assert 0.1 + QUIET_S <= time.monotonic() - started < 2 and idle.idle_for() >= QUIET_S
    assert gate.yields == 2 and gate.yielded_s > 0.2
    assert EngineYield(1.0).deadline() > time.monotonic()  # no idle event: never waits
    with pytest.raises(ValueError, match="defer_s"):
        EngineYield(-1)


def test_a_transaction_waits_until_the_engine_has_settled() -> None:
    idle = IdleEvent()
    gate = EngineYield(defer_s=5.0, idle=idle)
    idle.set_long_ago()  # idle for long: no wait
    started = time.monotonic()
    gate.wait(gate.deadline(), lambda: False)
    assert time.monotonic() - started < QUIET_S / 2 and gate.yields == 0
    idle.clear()
    started = time.monotonic()
    idle.set()  # a turn just ended: wait out the settling time
    gate.wait(gate.deadline(), lambda: False)
    assert QUIET_S <= time.monotonic() - started < QUIET_S + 1 and idle.idle_for() >= QUIET_S
    idle.clear()
    idle.set()
    asked = []

    def next_request_while_settling() -> bool:  # hurry() is asked first on entry, then each round
        asked.append(1)
        if len(asked) == 2:
            idle.clear()  # a submit while the writer waits out the settling time
            threading.Timer(0.3, idle.set).start()  # that request is done 0.3 s later
        return False

    started = time.monotonic()
    gate.wait(gate.deadline(), next_request_while_settling)
    assert 0.3 + QUIET_S <= time.monotonic() - started < 2 and idle.idle_for() >= QUIET_S
    assert gate.yields == 2
    idle.clear()
    assert idle.idle_for() == 0.0


def test_writes_wait_for_an_idle_engine(redis_client: redis.Redis, make_blocks: MakeBlocks) -> None:
    blocks = make_blocks(6)
    writer, tier = _busy_writer(redis_client, defer_s=30)
    writer.enqueue(blocks, pinned=True)
    time.sleep(0.4)
    assert _written(tier, blocks) == 0  # the engine is busy: nothing written yet
    assert writer.yielding.idle is not None
    writer.yielding.idle.set()
    assert _wait_written(tier, blocks, 5) < 2
    writer.stop()
    stats = writer.stats()
    assert stats.yields == 1 and stats.yielded_s >= 0.3 and stats.blocks_written == 6


def test_writes_go_through_a_busy_engine_after_the_deferral(
    redis_client: redis.Redis, make_blocks: MakeBlocks
) -> None:
    blocks = make_blocks(4)
    writer, tier = _busy_writer(redis_client, defer_s=0.3)
    writer.enqueue(blocks)
    assert 0.2 < _wait_written(tier, blocks, 10) < 5  # never idle, written anyway
    writer.stop()


def test_a_flush_a_full_queue_or_a_stop_never_waits_for_the_engine(
    redis_client: redis.Redis, make_blocks: MakeBlocks
) -> None:
    blocks = make_blocks(9)
    writer, tier = _busy_writer(redis_client, defer_s=30)
    writer.enqueue(blocks[:2])
    started = time.monotonic()
    assert writer.flush(10)
    assert time.monotonic() - started < 3 and _written(tier, blocks[:2]) == 2

    writer, tier = _busy_writer(redis_client, defer_s=30, queue_blocks=4)
    writer.enqueue(blocks[2:4])  # taken at once; yields
    time.sleep(0.2)
    writer.enqueue(blocks[4:7])  # 3 of 4 queued: more than half full, the writer hurries
    assert _wait_written(tier, blocks[:7], 5) < 3

    writer, tier = _busy_writer(redis_client, defer_s=30)
    writer.enqueue(blocks[7:])
    time.sleep(0.2)
    started = time.monotonic()
    writer.stop()  # writes what is queued, without waiting for the engine
    assert time.monotonic() - started < 3 and _written(tier, blocks[7:]) == 2


def test_the_loop_is_idle_only_with_nothing_to_run(tiny: TinyModel) -> None:
    engine = make_engine(tiny.loaded, num_blocks=16)
    with EngineLoop(engine) as loop:
        assert loop.idle.wait(5)
        handle = loop.submit(
            GenerationRequest.new(
                random_prompt(random.Random(3), 20), SamplingParams(max_tokens=200, **NO_EOS)
            )
        )
        assert not loop.idle.is_set()  # cleared by the submit itself
        handle.result(60)
        assert loop.idle.wait(5)
    assert loop.idle.is_set()  # a stopped loop never holds the writer back
    assert loop.idle.idle_for() >= QUIET_S  # as if idle for ever: no quiet time either
    late = loop.submit(
        GenerationRequest.new([1, 2, 3], SamplingParams(max_tokens=1))
    )  # refused: the loop has stopped
    with pytest.raises(EngineFailedError):
        late.result(5)
    assert loop.idle.idle_for() >= QUIET_S  # the refused submit did not clear it for good


def test_a_turn_written_while_the_engine_is_busy_resumes_exactly(
    tiny: TinyModel, redis_client: redis.Redis
) -> None:
    """A turn's write-through waits while the next requests run, then lands once the loop is idle;
    a fresh engine resumes from it token-exact."""
    rng = random.Random(41)
    history = random_prompt(rng, 70)
    params = SamplingParams(max_tokens=8, **NO_EOS)
    engine = make_engine(tiny.loaded, num_blocks=32, warm_cache_size_bytes=1 << 20)
    assert engine.tiers is not None
    tier = RedisTier(redis_client, engine.served.kv_format, 10**9)
    writer = KVWriter(tier, defer_s=30)
    engine.tiers.attach(writer)
    assert writer.ready.wait(30)  # a writer thread still setting up would take turn 1 only after slow
    with EngineLoop(engine) as loop:
        writer.yielding.idle = loop.idle
        slow = loop.submit(
            GenerationRequest.new(random_prompt(rng, 30), SamplingParams(max_tokens=400, **NO_EOS))
        )
        out = loop.submit(GenerationRequest.new(history, params)).result(60)
        assert_tokens(out.token_ids, tiny.expected(history, 8), "turn 1")
        taken = time.monotonic() + 30  # the writer holds turn 1's blocks, waiting for the engine
        while writer.stats().queued_writes and time.monotonic() < taken:
            time.sleep(0.01)
        time.sleep(0.1)
        assert not slow.done(), "the slow request must outlast the check"
        stats = writer.stats()
        assert stats.blocks_staged == 4 and stats.queued_writes == 0 and tier.stats().blocks_written == 0
        slow.result(120)
        assert loop.idle.wait(5)
        assert writer.flush(30)
    writer.stop()
    assert writer.stats().yields >= 1 and tier.stats().blocks_written >= 4
    turn2 = [*history, *out.token_ids, *random_prompt(rng, 5)]
    fresh = make_engine(tiny.loaded, num_blocks=32, warm_cache_size_bytes=1 << 20)
    assert prefetch(EngineTarget(fresh), tier, turn2, "") >= 4
    resumed = run_checked(fresh, {"turn2": (turn2, params)})["turn2"]
    assert_tokens(resumed.token_ids, tiny.expected(turn2, 8), "turn 2 from Redis")
