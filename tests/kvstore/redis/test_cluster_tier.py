"""The cold tier on a real 3-shard Redis Cluster (ops/redis/cluster.py): packs spread over the
shards, the metadata in one slot; pins, quota and eviction as on one Redis; a shard SIGKILLed
costs misses (the leading run up to its first pack), never an exception; the metadata's shard
killed, every block misses."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster

from kvstore.layout import KVFormat
from kvstore.redis import cluster_fetch
from kvstore.redis.client import kv_client, parse_cluster_url
from kvstore.redis.report import read_report
from kvstore.redis.tier import RedisTier
from kvstore.redis.write import PacksNotWritten
from kvstore.tiers.stored_block import StoredBlock
from ops.redis.cluster import LocalCluster
from tests.kvstore.conftest import MakeBlocks

BIG = 10**9


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(Path(tmp_path_factory.mktemp("kv-cluster")), shards=3) as c:
        yield c


@pytest.fixture
def kv(cluster: LocalCluster) -> Iterator[RedisCluster]:
    for i in range(cluster.shards):
        if not cluster.alive(i):
            cluster.restart_shard(i)
        cluster.node(i).flushall()
    client = kv_client(cluster.url)
    assert isinstance(client, RedisCluster)
    yield client
    client.close()


def shard_of(cluster: LocalCluster, client: RedisCluster, key: bytes | str) -> int:
    return cluster.shard_of_slot(client.keyslot(key))


def pack_keys(client: RedisCluster, tier: RedisTier, blocks: list[StoredBlock]) -> list[bytes]:
    return [k for k in client.hmget(tier.keys.index, [b.block_hash for b in blocks]) if k is not None]


def hashes(blocks: list[StoredBlock]) -> list[bytes]:
    return [b.block_hash for b in blocks]


def tokens(blocks: list[StoredBlock]) -> list[tuple[int, ...]]:
    return [b.token_ids for b in blocks]


def test_cluster_urls() -> None:
    assert parse_cluster_url("redis+cluster://:p%40ss@h1:7000,h2:7001/") == (
        None,
        "p@ss",
        [("h1", 7000), ("h2", 7001)],
    )
    assert parse_cluster_url("redis+cluster://u:pw@[::1]:7000") == ("u", "pw", [("::1", 7000)])
    assert parse_cluster_url("redis+cluster://h:1") == (None, None, [("h", 1)])
    for bad in ("redis://h:1", "redis+cluster://h", "redis+cluster://:pw@h:x"):
        with pytest.raises(ValueError):
            parse_cluster_url(bad)


def test_the_url_names_a_cluster_and_packs_spread_over_shards(
    cluster: LocalCluster, kv: RedisCluster, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    blocks = make_blocks(12)
    tier = RedisTier(kv, tiny_fmt, BIG, blocks_per_pack=1)
    assert tier.put(blocks) == 12
    assert tier.get_run(hashes(blocks), tokens(blocks)) == blocks
    packs = pack_keys(kv, tier, blocks)
    assert len(packs) == 12
    assert len({shard_of(cluster, kv, p) for p in packs}) > 1  # the bytes spread
    metadata = {kv.keyslot(k) for k in [*tier.keys.namespace(), tier.keys.owners("t")]}
    assert len(metadata) == 1  # the scripts' keys share a slot
    tier.check_integrity()
    assert tier.put(blocks) == 0  # written once
    stats = tier.stats()
    assert (stats.packs, stats.read_hits) == (12, 12)


def test_eviction_pins_and_quota_keep_their_atomicity(
    cluster: LocalCluster,
    kv: RedisCluster,
    redis_client: redis.Redis,
    tiny_fmt: KVFormat,
    make_blocks: MakeBlocks,
) -> None:
    first, second = make_blocks(4, seed=1), make_blocks(4, seed=2)
    probe = RedisTier(kv, tiny_fmt, BIG, blocks_per_pack=1)
    assert probe.put(first) == 4
    block_bytes, pack_bytes = probe.stored_block_bytes, probe.stats().bytes_stored // 4
    # room for 6 packs; a tenant may pin 4 blocks
    quota = 4 * block_bytes
    tier = RedisTier(kv, tiny_fmt, 6 * pack_bytes + 100, blocks_per_pack=1, tenant_quota_bytes=quota)
    change = tier.pin_session("t", "s1", hashes(first))
    assert change.added == 4
    assert tier.put(second) == 4  # over the cap: the unpinned go (its tail first), none of s1's
    assert tier.get_run(hashes(first), tokens(first)) == first
    assert tier.stats().packs_evicted == 2
    tier.check_integrity()  # the evicted packs were unlinked on their shards: no stray pack
    assert tier.pin_session("t", "s2", hashes(second[:2])).owners_released == 1  # quota: s1 goes
    assert tier.pinned_bytes_by_tenant() == {"t": 2 * block_bytes}
    assert tier.release_session("t", "s2") == 2
    tier.check_integrity()
    report = read_report(kv, redis_client)
    assert (report["packs"], report["blocks_written"], report["packs_evicted"]) == (6, 8, 2)
    tier.clear()
    assert list(kv.scan_iter(match=tier.keys.pack_pattern)) == []
    assert list(kv.scan_iter(match=tier.keys.pattern)) == []


def test_a_dead_shard_costs_the_run_from_its_first_pack_on(
    cluster: LocalCluster,
    kv: RedisCluster,
    tiny_fmt: KVFormat,
    make_blocks: MakeBlocks,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cluster_fetch, "DOWN_S", 0.5)  # how long a down node is left alone
    blocks = make_blocks(12, seed=3)
    tier = RedisTier(kv, tiny_fmt, BIG, blocks_per_pack=1)
    assert tier.put(blocks) == 12
    meta = shard_of(cluster, kv, tier.keys.index)
    shards = [shard_of(cluster, kv, p) for p in pack_keys(kv, tier, blocks)]
    dead = next(s for s in shards if s != meta)
    cut = shards.index(dead)
    cluster.kill_shard(dead)
    assert tier.get_run(hashes(blocks), tokens(blocks)) == blocks[:cut]  # a miss, no exception
    assert tier.fetcher.cluster is not None and tier.fetcher.cluster.node_failures == 1
    assert tier.get_run(hashes(blocks), tokens(blocks)) == blocks[:cut]  # not repaired away
    assert tier.fetcher.cluster.node_failures == 1  # left alone while it is down: no connect
    assert tier.contains_run(hashes(blocks)) == 12  # the index still names the dead shard's packs
    more = make_blocks(9, seed=4)
    with pytest.raises(PacksNotWritten) as refused:  # the KV writer counts and drops it
        tier.put(more)
    lost = set(refused.value.hashes)
    assert lost and lost < set(hashes(more))
    assert kv.hmget(tier.keys.index, list(lost)) == [None] * len(lost)  # never indexed
    cluster.restart_shard(dead)  # back, empty: its packs are gone for good
    time.sleep(0.5)
    assert tier.get_run(hashes(blocks), tokens(blocks)) == blocks[:cut]
    assert tier.contains_run(hashes(blocks)) == cut  # the reader dropped the first vanished pack
    for block in blocks[cut:]:
        tier.get_run([block.block_hash])  # each miss repairs its own entry
    tier.put(more)  # what the dead shard refused is written now
    tier.check_integrity()


def test_a_dead_metadata_shard_is_all_misses(
    cluster: LocalCluster, kv: RedisCluster, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    blocks = make_blocks(6, seed=5)
    tier = RedisTier(kv, tiny_fmt, BIG, blocks_per_pack=1)
    assert tier.put(blocks) == 6
    cluster.kill_shard(shard_of(cluster, kv, tier.keys.index))
    assert tier.get_run(hashes(blocks), tokens(blocks)) == []
    assert tier.contains_run(hashes(blocks)) == 0
    # writes and pins raise, for their callers to count (the KV writer, the session keeper)
    with pytest.raises(redis.ConnectionError):
        tier.put(make_blocks(2, seed=6))
    with pytest.raises(redis.ConnectionError):
        tier.pin_session("t", "s", hashes(blocks))


def test_a_stale_slot_map_is_followed(
    cluster: LocalCluster, kv: RedisCluster, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    """A node answering MOVED (the client's slot map is stale): the pack is asked again through
    redis-py's cluster client, on reads and writes alike, and nothing is lost."""
    blocks, more = make_blocks(6, seed=7), make_blocks(1, seed=8)
    tier = RedisTier(kv, tiny_fmt, BIG, blocks_per_pack=1)
    assert tier.put(blocks) == 6
    slots = kv.nodes_manager.slots_cache

    def mislead(key: bytes | str) -> None:
        right = slots[kv.keyslot(key)][0]
        slots[kv.keyslot(key)] = [next(n for n in kv.get_primaries() if n.name != right.name)]

    mislead(pack_keys(kv, tier, blocks)[2])
    assert tier.get_run(hashes(blocks), tokens(blocks)) == blocks
    mislead(tier.keys.pack(hashes(more)))
    assert tier.put(more) == 1
    assert tier.get_run(hashes(more), tokens(more)) == more
    tier.check_integrity()
