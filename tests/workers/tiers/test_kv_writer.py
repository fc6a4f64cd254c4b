"""KVWriter: a bounded queue that drops the oldest unpinned write (counted), coalesces what is
queued into one put, copies staged blocks before the pool may reuse their slots, and never holds
up the engine when Redis is slow or gone. Plus a turn written through it and resumed on a fresh
engine from a real Redis, token-exact vs HF generate."""

# The Redis and block fixtures of tests/kvstore, imported: test arguments share their names.
# ruff: noqa: F811

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Collection, Sequence

import pytest
import redis
import torch

from broker.sampling import SamplingParams
from kvstore.layout import KVFormat
from kvstore.pool.kv_cache import KVCache
from kvstore.redis.tier import RedisTier
from kvstore.tiers.stored_block import StoredBlock
from ops.bench.engine.target import EngineTarget
from tests.kvstore.conftest import TINY_LAYOUT, MakeBlocks, make_blocks, redis_client, redis_server  # noqa: F401
from tests.workers._helpers import NO_EOS, TinyModel, assert_tokens, make_engine, random_prompt, run_checked
from workers.engine.tiers.pending_write import BlockMeta
from workers.tiers.prefetch import prefetch
from workers.tiers.writer import KVWriter

FMT = KVFormat.from_layout(TINY_LAYOUT, "tiny-test")
BLOCK = FMT.nbytes


class GatedTier:
    """A stand-in for RedisTier: put waits for ``gate`` (a slow or hung Redis), then records."""

    def __init__(self, fail: bool = False) -> None:
        self.fmt = FMT
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.fail = fail
        self.puts: list[list[StoredBlock]] = []

    def put(
        self, blocks: Sequence[StoredBlock], before_tx: Callable[[], None] | None = None, alone: object = ()
    ) -> int:
        if before_tx is not None:  # one transaction
            before_tx()
        self.entered.set()
        self.gate.wait(30)
        if self.fail:
            raise redis.ConnectionError("Redis is unreachable")
        self.puts.append([StoredBlock(b.block_hash, b.parent_hash, b.token_ids, bytes(b.kv)) for b in blocks])
        return len(blocks)


def _writer(tier: GatedTier, blocks: int, dropped: list[bytes]) -> KVWriter:
    return KVWriter(tier, max_queued_bytes=blocks * BLOCK, on_drop=dropped.extend)  # type: ignore[arg-type]


def _hold_writer(writer: KVWriter, tier: GatedTier, block: StoredBlock) -> None:
    """Queue one write and wait until the writer is stuck in its put."""
    writer.enqueue([block])
    assert tier.entered.wait(5)


def test_full_queue_drops_the_oldest_unpinned_write_and_coalesces_the_rest(
    make_blocks: MakeBlocks,
) -> None:
    a, b, c, d, e = make_blocks(5)
    tier, dropped = GatedTier(), list[bytes]()
    writer = _writer(tier, 3, dropped)
    _hold_writer(writer, tier, a)  # in flight: never dropped
    writer.enqueue([b])
    writer.enqueue([c], pinned=True)
    writer.enqueue([d])
    assert writer.stats().writes_dropped == 0
    writer.enqueue([e])  # 4 blocks queued, room for 3: b goes, the oldest unpinned
    stats = writer.stats()
    assert (stats.writes_dropped, stats.blocks_dropped, stats.queued_writes) == (1, 1, 3)
    assert dropped == [b.block_hash]
    tier.gate.set()
    assert writer.flush(10)
    writer.stop()
    assert [[blk.block_hash for blk in put] for put in tier.puts] == [
        [a.block_hash],
        [c.block_hash, d.block_hash, e.block_hash],  # one put for everything queued
    ]
    assert tier.puts[1][0].kv == c.kv
    assert (writer.stats().batches, writer.stats().blocks_written) == (2, 4)


def test_pinned_writes_go_only_when_nothing_unpinned_is_left(make_blocks: MakeBlocks) -> None:
    a, b, c, d = make_blocks(4)
    tier, dropped = GatedTier(), list[bytes]()
    writer = _writer(tier, 2, dropped)
    _hold_writer(writer, tier, a)
    writer.enqueue([b], pinned=True)
    writer.enqueue([c], pinned=True)
    writer.enqueue([d], pinned=True)
    assert dropped == [b.block_hash]
    tier.gate.set()
    writer.stop()


def _pool(n: int, seed: int) -> KVCache:
    cache = KVCache(TINY_LAYOUT, num_blocks=n, device="cpu")
    cache.tensor.copy_(torch.randn(cache.tensor.shape, generator=torch.Generator().manual_seed(seed)))
    return cache


def _metas(blocks: list[StoredBlock]) -> list[BlockMeta]:
    return [BlockMeta(b.block_hash, b.parent_hash, b.token_ids) for b in blocks]


def test_staged_blocks_are_copied_before_the_pool_reuses_their_slots(make_blocks: MakeBlocks) -> None:
    first, *chain = make_blocks(4)
    pool = _pool(6, seed=3)
    before = [pool.read_block(i) for i in (4, 1, 5)]
    tier, dropped = GatedTier(), list[bytes]()
    writer = _writer(tier, 8, dropped)
    _hold_writer(writer, tier, first)
    assert writer.stage(_metas(chain), pool.by_block(), [4, 1, 5]) == 3
    pool.tensor.normal_()  # the slots are reused and overwritten while the write waits
    tier.gate.set()
    assert writer.flush(10)
    writer.stop()
    assert [blk.kv for blk in tier.puts[1]] == before
    assert writer.stats().blocks_staged == 3


def test_staging_with_no_room_drops_the_oldest_staged_write(make_blocks: MakeBlocks) -> None:
    blocks = make_blocks(6)
    pool = _pool(6, seed=4)
    tier, dropped = GatedTier(), list[bytes]()
    writer = _writer(tier, 4, dropped)  # a staging arena of 4 blocks
    assert writer.stage(_metas(blocks[0:2]), pool.by_block(), [0, 1]) == 2
    assert tier.entered.wait(5)  # in flight, holding 2 slots
    assert writer.stage(_metas(blocks[2:4]), pool.by_block(), [2, 3]) == 2
    assert writer.stage(_metas(blocks[4:6]), pool.by_block(), [4, 5]) == 2  # drops the queued one
    assert dropped == [b.block_hash for b in blocks[2:4]]
    assert writer.stats().writes_dropped == 1
    tier.gate.set()
    assert writer.flush(10)
    writer.stop()
    assert [blk.kv for blk in tier.puts[1]] == [pool.read_block(4), pool.read_block(5)]


@pytest.mark.parametrize("fail", [False, True], ids=["slow", "unreachable"])
def test_the_engine_never_waits_for_a_slow_or_unreachable_redis(tiny: TinyModel, fail: bool) -> None:
    rng = random.Random(31)
    engine = make_engine(tiny.loaded, num_blocks=12, warm_cache_size_bytes=1 << 20)
    assert engine.tiers is not None
    tier = GatedTier(fail=fail)
    writer = KVWriter(tier, max_queued_bytes=6 * engine.served.kv_format.nbytes)  # type: ignore[arg-type]
    engine.tiers.attach(writer)
    params = SamplingParams(max_tokens=4, **NO_EOS)
    started = time.perf_counter()
    for i in range(6):  # each turn queues 3 blocks; the writer is stuck in its first put
        run_checked(engine, {f"r{i}": (random_prompt(rng, 50), params)})
    assert time.perf_counter() - started < 20  # far below the 30 s put, and no exception
    assert not tier.gate.is_set() and tier.entered.is_set()
    assert writer.stats().writes_dropped > 0
    tier.gate.set()
    assert writer.flush(10)
    writer.stop()
    stats = writer.stats()
    assert stats.put_errors == (stats.batches if fail else 0)
    if fail:  # nothing reached Redis: a later spill may write those blocks again
        assert not engine.tiers._persisted


class GatedRedisTier(RedisTier):
    gate = threading.Event()

    def put(
        self,
        blocks: Sequence[StoredBlock],
        before_tx: Callable[[], None] | None = None,
        alone: Collection[bytes] = (),
    ) -> int:
        self.gate.wait(30)
        return super().put(blocks, before_tx, alone)


def test_a_turn_written_through_the_writer_resumes_exactly_on_a_fresh_engine(
    tiny: TinyModel,
    redis_client: redis.Redis,
) -> None:
    rng = random.Random(32)
    history = random_prompt(rng, 70)  # 4 full blocks and a partial one
    params = SamplingParams(max_tokens=10, **NO_EOS)
    first = make_engine(tiny.loaded, num_blocks=8, warm_cache_size_bytes=1 << 20)
    assert first.tiers is not None
    tier = GatedRedisTier(redis_client, first.served.kv_format, 10**9)
    tier.gate = threading.Event()
    writer = KVWriter(tier)
    first.tiers.attach(writer)
    out = run_checked(first, {"turn1": (history, params)})["turn1"]
    assert_tokens(out.token_ids, tiny.expected(history, 10), "turn 1")
    for i in range(3):  # the pool's slots are reused while the turn's write waits for Redis
        run_checked(first, {f"filler{i}": (random_prompt(rng, 100), SamplingParams(max_tokens=2, **NO_EOS))})
    tier.gate.set()
    assert writer.flush(30)
    writer.stop()
    tier.check_integrity()

    turn2 = [*history, *out.token_ids, *random_prompt(rng, 7)]
    fresh = make_engine(tiny.loaded, num_blocks=16, warm_cache_size_bytes=1 << 20)
    assert prefetch(EngineTarget(fresh), tier, turn2, "") >= 4
    resumed = run_checked(fresh, {"turn2": (turn2, params)})["turn2"]
    assert_tokens(resumed.token_ids, tiny.expected(turn2, 10), "turn 2 from Redis")
    assert resumed.redis_tokens >= 64


def test_dropped_writes_are_counted_in_the_tier_for_metrics(
    redis_client: redis.Redis,
    make_blocks: MakeBlocks,
) -> None:
    a, b, c, d = make_blocks(4)
    tier = GatedRedisTier(redis_client, FMT, 10**9)
    tier.gate = threading.Event()
    writer = KVWriter(tier, max_queued_bytes=2 * BLOCK)
    writer.enqueue([a])
    time.sleep(0.2)  # a is in flight
    for block in (b, c, d):
        writer.enqueue([block])
    tier.gate.set()
    assert writer.flush(10)
    writer.stop()
    assert writer.stats().writes_dropped == 1
    assert redis_client.hget(tier.keys.counters, "writes_dropped") == b"1"
    assert tier.contains_run([a.block_hash]) == 1 and tier.contains_run([b.block_hash]) == 0
