"""The host-memory tier: exact LRU eviction by bytes, runs, refreshes, counters, threads."""

from __future__ import annotations

import random
import threading

import pytest

from kvstore.tiers.stats import WarmTierStats
from kvstore.tiers.stored_block import StoredBlock
from kvstore.tiers.warm import WarmTier


def blk(name: str, size: int = 10) -> StoredBlock:
    return StoredBlock(name.encode().ljust(32, b"."), b"p" * 32, (1, 2), b"x" * size)


def keys(tier: WarmTier, *names: str) -> list[str]:
    """The names among ``names`` the tier holds (does not refresh)."""
    return [n for n in names if blk(n).block_hash in tier]


def test_rejects_negative_capacity() -> None:
    with pytest.raises(ValueError):
        WarmTier(-1)


def test_evicts_least_recently_used_until_bytes_fit() -> None:
    tier = WarmTier(capacity_bytes=100)
    tier.put(blk("a", 40))
    tier.put(blk("b", 40))
    assert (len(tier), tier.nbytes) == (2, 80)
    tier.put(blk("c", 30))  # 110 > 100: a goes
    assert keys(tier, "a", "b", "c") == ["b", "c"] and tier.nbytes == 70
    tier.put(blk("d", 60))  # 130: b goes (100 fits)
    assert keys(tier, "b", "c", "d") == ["c", "d"] and tier.nbytes == 90
    tier.put(blk("e", 95))  # c and d both go
    assert keys(tier, "c", "d", "e") == ["e"] and tier.nbytes == 95
    assert tier.stats() == WarmTierStats(
        blocks=1, bytes=95, capacity_bytes=100, hits=0, misses=0, evictions=4
    )


def test_get_refreshes_and_peek_does_not() -> None:
    tier = WarmTier(capacity_bytes=30)
    for name in "abc":
        tier.put(blk(name))
    assert tier.get(blk("a").block_hash) == blk("a")  # a is now the most recent
    assert tier.peek(blk("b").block_hash) == blk("b")  # b stays the least recent
    tier.put(blk("d"))
    assert keys(tier, "a", "b", "c", "d") == ["a", "c", "d"]
    tier.put(blk("e"))
    assert keys(tier, "a", "c", "d", "e") == ["a", "d", "e"]
    assert tier.get(blk("zzz").block_hash) is None
    assert (tier.stats().hits, tier.stats().misses) == (1, 1)


def test_peek_run_stops_at_first_miss_and_changes_nothing() -> None:
    tier = WarmTier(capacity_bytes=30)
    for name in "abc":
        tier.put(blk(name))
    assert tier.peek_run([blk(n).block_hash for n in "abxc"]) == [blk("a"), blk("b")]
    assert tier.stats().hits == tier.stats().misses == 0
    tier.put(blk("d"))  # a is still the least recent: peeking refreshed nothing
    assert keys(tier, "a", "b", "c", "d") == ["b", "c", "d"]


def test_put_again_refreshes_without_counting_twice() -> None:
    tier = WarmTier(capacity_bytes=30)
    for name in "abc":
        tier.put(blk(name))
    tier.put(blk("a"))
    assert tier.nbytes == 30 and len(tier) == 3
    tier.put(blk("d"))
    assert keys(tier, "a", "b", "c", "d") == ["a", "c", "d"]


def test_block_larger_than_capacity_is_not_stored_and_evicts_nothing() -> None:
    tier = WarmTier(capacity_bytes=25)
    tier.put(blk("a"))
    tier.put(blk("big", 26))
    assert keys(tier, "a", "big") == ["a"]
    assert tier.stats().evictions == 0
    assert len(WarmTier(0)) == 0


def test_get_run_stops_at_first_miss_and_keeps_the_prefix_most_recent() -> None:
    tier = WarmTier(capacity_bytes=40)
    for name in "abcd":
        tier.put(blk(name))
    run = tier.get_run([blk(n).block_hash for n in "abxd"])
    assert run == [blk("a"), blk("b")]
    assert (tier.stats().hits, tier.stats().misses) == (2, 2)
    assert tier.get_run([]) == []
    # refreshed last block first: LRU order is now c, d, b, a (a sequence's tail goes first)
    tier.put(blk("e"))
    assert keys(tier, "a", "b", "c", "d", "e") == ["a", "b", "d", "e"]
    tier.put(blk("f"))
    assert keys(tier, "a", "b", "d", "e", "f") == ["a", "b", "e", "f"]
    tier.put(blk("g"))
    assert keys(tier, "a", "b", "e", "f", "g") == ["a", "e", "f", "g"]


def test_pop_and_contains() -> None:
    tier = WarmTier(capacity_bytes=100)
    tier.put(blk("a", 7))
    assert blk("a").block_hash in tier and b"nope" not in tier
    assert tier.pop(blk("a").block_hash) == blk("a", 7)
    assert tier.pop(blk("a").block_hash) is None
    assert (len(tier), tier.nbytes) == (0, 0)


def test_threads_keep_the_byte_count_exact() -> None:
    tier = WarmTier(capacity_bytes=500)
    names = [f"blk{i}" for i in range(60)]
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(2000):
                op = rng.random()
                name = rng.choice(names)
                if op < 0.4:
                    tier.put(blk(name, rng.randint(1, 40)))
                elif op < 0.7:
                    block = tier.get(blk(name).block_hash)
                    assert block is None or block.block_hash == blk(name).block_hash
                elif op < 0.9:
                    tier.get_run([blk(n).block_hash for n in rng.sample(names, 5)])
                else:
                    tier.pop(blk(name).block_hash)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    held = [tier.peek(blk(n).block_hash) for n in names]
    assert tier.nbytes == sum(len(b.kv) for b in held if b is not None) <= 500
    assert len(tier) == sum(b is not None for b in held) == tier.stats().blocks
