"""Pins by owner against a real redis-server: exact sets diffed per turn, releases, tenants'
quotas, the byte cap over pinned packs, races, and packs that Redis itself evicted."""

from __future__ import annotations

import threading

import redis

from kvstore.layout import KVFormat
from kvstore.redis.keys import PinOwner
from kvstore.redis.tier import RedisTier
from kvstore.tiers.codec import encode_pack
from kvstore.tiers.stored_block import StoredBlock
from tests.kvstore.conftest import MakeBlocks

BIG = 10**9


def hashes(blocks: list[StoredBlock]) -> list[bytes]:
    return [b.block_hash for b in blocks]


def pins_of(tier: RedisTier, tenant: str, session: str) -> set[bytes]:
    return set(tier.client.smembers(tier.keys.pinset(PinOwner.session(tenant, session))))  # type: ignore[arg-type]


def test_owner_ids_are_unambiguous() -> None:
    for tenant, name in (("a:b", "c"), ("a", "b:c"), ("", ""), ("t", "x:1:y"), ("ü", "s")):
        for owner in (PinOwner.session(tenant, name), PinOwner.preload(tenant)):
            assert PinOwner.parse(owner.id) == owner
    assert PinOwner.session("a:b", "c").id != PinOwner.session("a", "b:c").id


def test_a_turn_that_edits_history_unpins_what_left_the_chain(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    old = make_blocks(6)
    edited = old[:3] + make_blocks(4, seed=1)  # the client rewrote turn 2: a new chain after block 3
    tier = RedisTier(redis_client, tiny_fmt, BIG, blocks_per_pack=2)
    tier.put(old + edited)
    first = tier.pin_session("t", "s", hashes(old), version=1.0)
    assert (first.added, first.removed) == (6, 0)
    second = tier.pin_session("t", "s", hashes(edited), version=2.0)
    assert (second.added, second.removed) == (4, 3)
    assert pins_of(tier, "t", "s") == set(hashes(edited))
    assert tier.pinned_bytes_by_tenant() == {"t": 7 * tiny_fmt.nbytes}
    tier.check_integrity()
    assert tier.pin_session("t", "s", hashes(old), version=1.5).stale  # an older turn, finished last
    assert pins_of(tier, "t", "s") == set(hashes(edited))
    assert tier.release_session("t", "s") == 7
    assert tier.pinned_bytes_by_tenant() == {}
    tier.check_integrity()


def test_sessions_sharing_blocks_and_tenants_sharing_ids(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    blocks = make_blocks(4)
    tier = RedisTier(redis_client, tiny_fmt, BIG, blocks_per_pack=1)
    tier.put(blocks)
    tier.pin_session("A", "s", hashes(blocks))
    tier.pin_session("B", "s", hashes(blocks[:2]))  # B's own session "s": never touches A's
    tier.pin_session("A", "other", hashes(blocks[:1]))
    assert redis_client.hget(tier.keys.block_pins, blocks[0].block_hash) == b"3"
    tier.release_session("B", "s")
    assert pins_of(tier, "A", "s") == set(hashes(blocks))
    assert tier.pinned_bytes_by_tenant() == {"A": 5 * tiny_fmt.nbytes}
    tier.check_integrity()


def test_quota_releases_only_the_tenants_own_least_recent_sessions(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    a1, a2, a3, b1 = (make_blocks(2, seed=s) for s in range(4))
    n = tiny_fmt.nbytes
    tier = RedisTier(redis_client, tiny_fmt, BIG, blocks_per_pack=1, tenant_quota_bytes=4 * n)
    tier.put(a1 + a2 + a3 + b1)
    tier.pin_session("B", "b1", hashes(b1), version=1.0)  # B's is the oldest session of all
    tier.pin_session("A", "a1", hashes(a1), version=2.0)
    tier.pin_session("A", "a2", hashes(a2), version=3.0)
    tier.pin_session("A", "a1", hashes(a1), version=4.0)  # a1 used again: a2 is A's least recent now
    change = tier.pin_session("A", "a3", hashes(a3), version=5.0)
    assert change.owners_released == 1
    assert pins_of(tier, "A", "a2") == set()
    assert pins_of(tier, "A", "a1") == set(hashes(a1)) and pins_of(tier, "A", "a3") == set(hashes(a3))
    assert pins_of(tier, "B", "b1") == set(hashes(b1))
    assert tier.pinned_bytes_by_tenant() == {"A": 4 * n, "B": 2 * n}
    tier.check_integrity()


def test_the_cap_holds_when_pinned_packs_alone_exceed_it(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    a_old, a_new, b = (make_blocks(2, seed=s) for s in range(3))
    size = len(encode_pack(tiny_fmt, a_old[:1]))
    loader = RedisTier(redis_client, tiny_fmt, BIG, blocks_per_pack=1)
    loader.put(a_old + a_new + b)
    loader.pin_session("A", "old", hashes(a_old), version=1.0)
    loader.pin_session("A", "new", hashes(a_new), version=2.0)
    loader.pin_session("B", "b", hashes(b), version=0.5)
    tier = RedisTier(
        redis_client, tiny_fmt, 5 * size, blocks_per_pack=1, tenant_quota_bytes=3 * tiny_fmt.nbytes
    )
    tier.put(make_blocks(1, seed=9))  # 7 packs, all but the new one pinned, cap 5
    # A is the tenant over its quota: its oldest session goes, then the unpinned packs can.
    assert pins_of(tier, "A", "old") == set() and tier.stats().bytes_stored <= 5 * size
    assert pins_of(tier, "A", "new") == set(hashes(a_new)) and pins_of(tier, "B", "b") == set(hashes(b))
    assert tier.contains_run(hashes(a_new)) == 2 and tier.contains_run(hashes(b)) == 2
    tier.check_integrity()


def test_without_quotas_a_tenant_pinning_past_the_cap_loses_its_own_pins_not_others(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    # B holds the most pins, so "the biggest tenant pays" would strip B for A's new pin
    b_blocks, a1, a2 = make_blocks(4, seed=20), make_blocks(1, seed=21), make_blocks(1, seed=22)
    size = len(encode_pack(tiny_fmt, b_blocks[:1]))
    loader = RedisTier(redis_client, tiny_fmt, BIG, blocks_per_pack=1)
    loader.put(b_blocks + a1 + a2)
    loader.pin_session("B", "b", hashes(b_blocks), version=1.0)  # B pinned first and is older
    loader.pin_session("A", "a1", hashes(a1), version=2.0)
    tier = RedisTier(redis_client, tiny_fmt, 5 * size, blocks_per_pack=1)  # no quota at all
    tier.pin_session("A", "a2", hashes(a2), version=3.0)  # 6 pinned packs over a cap of 5
    assert pins_of(tier, "B", "b") == set(hashes(b_blocks))  # never B's, for A's sake
    assert pins_of(tier, "A", "a1") == set() and pins_of(tier, "A", "a2") == set(hashes(a2))
    assert tier.stats().bytes_stored <= 5 * size
    tier.check_integrity()


def test_concurrent_turns_of_one_session_leave_exactly_the_newest_chain(
    redis_server: object, redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    chains = [make_blocks(3, seed=0) + make_blocks(3, seed=10 + i) for i in range(8)]
    kwargs = redis_client.connection_pool.connection_kwargs
    RedisTier(redis_client, tiny_fmt, BIG, blocks_per_pack=2).put([b for c in chains for b in c])
    errors: list[BaseException] = []

    def turn(i: int) -> None:
        tier = RedisTier(
            redis.Redis(host=kwargs["host"], port=kwargs["port"]), tiny_fmt, BIG, blocks_per_pack=2
        )
        try:
            for rep in range(20):
                tier.pin_session("t", "s", hashes(chains[i]), version=rep * 10 + i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=turn, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    tier = RedisTier(redis_client, tiny_fmt, BIG, blocks_per_pack=2)
    assert pins_of(tier, "t", "s") == set(hashes(chains[7]))  # version 197: the newest turn
    assert tier.pinned_bytes_by_tenant() == {"t": 6 * tiny_fmt.nbytes}
    tier.check_integrity()
    tier.release_session("t", "s")
    assert redis_client.hlen(tier.keys.block_pins) == 0


def test_packs_redis_evicted_or_flushed_are_misses(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    blocks = make_blocks(6)
    tier = RedisTier(redis_client, tiny_fmt, BIG, blocks_per_pack=2)
    tier.put(blocks)
    tier.pin_session("t", "s", hashes(blocks))
    for key in redis_client.scan_iter(match=tier.keys.pack_pattern):
        redis_client.delete(key)  # as maxmemory-policy volatile-lru would: packs carry the TTL
    assert tier.get_run(hashes(blocks)) == []
    # The read cleaned up the first pack it found gone: those 2 blocks are no longer pinned.
    assert tier.pin_session("t", "s", hashes(blocks)).removed == 2
    assert tier.put(blocks) == 2  # re-written; the next vanished pack ends the run
    assert tier.get_run(hashes(blocks)) == blocks[:2]
    redis_client.flushdb()  # every key gone, index and pins too
    assert tier.get_run(hashes(blocks)) == [] and tier.contains_run(hashes(blocks)) == 0
    assert tier.pin_session("t", "s", hashes(blocks)).added == 0
    assert tier.release_session("t", "s") == 0
    assert tier.put(blocks) == 6 and tier.get_run(hashes(blocks)) == blocks
    tier.check_integrity()


def test_a_redis_at_maxmemory_evicts_only_packs(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    before = redis_client.config_get("maxmemory*")
    used = int(redis_client.info("memory")["used_memory"])
    redis_client.config_set("maxmemory-policy", "volatile-lru")
    redis_client.config_set("maxmemory", used + 2 * 1024**2)
    try:
        tier = RedisTier(redis_client, tiny_fmt, BIG, blocks_per_pack=4)  # our own cap out of the way
        chains = [make_blocks(8, seed=s) for s in range(40)]  # ~2.6 MB of packs
        for chain in chains:
            tier.put(chain)
        tier.pin_session("t", "s", hashes(chains[-1]))
        k = tier.keys
        assert all(redis_client.exists(key) for key in (k.index, k.lru, k.packs, k.bytes, k.counters))
        assert redis_client.hlen(k.index) == 40 * 8  # the index was never evicted
        assert int(redis_client.info("stats")["evicted_keys"]) > 0
        hits = sum(len(tier.get_run(hashes(chain))) for chain in chains)  # misses, never errors
        assert 0 < hits < 40 * 8
    finally:
        redis_client.config_set("maxmemory", str(before["maxmemory"]))
        redis_client.config_set("maxmemory-policy", str(before["maxmemory-policy"]))
