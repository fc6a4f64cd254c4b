"""The cold tier against a real redis-server: exact bytes, packing, write-once, runs, corruption,
foreign formats, the byte cap's exact LRU order, pins, clear. check_integrity after every step."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import redis
import torch

from kvstore.layout import KVFormat
from kvstore.pool.kv_cache import KVCache
from kvstore.redis import tier as redis_tier
from kvstore.redis.keys import TIER_REGISTRY
from kvstore.redis.tier import RedisTier, TierKeys
from kvstore.tiers.codec import encode_pack
from kvstore.tiers.stored_block import StoredBlock
from tests.kvstore.conftest import TINY_LAYOUT, MakeBlocks

BIG = 10**9


def hashes(blocks: list[StoredBlock]) -> list[bytes]:
    return [b.block_hash for b in blocks]


def tokens(blocks: list[StoredBlock]) -> list[tuple[int, ...]]:
    return [b.token_ids for b in blocks]


def pack_of(client: redis.Redis, tier: RedisTier, block: StoredBlock) -> bytes:
    key = client.hget(tier.keys.index, block.block_hash)
    assert isinstance(key, bytes)
    return key


def held(tier: RedisTier, blocks: list[StoredBlock]) -> list[int]:
    """Indexes of the blocks the tier's index holds."""
    return [i for i, b in enumerate(blocks) if tier.contains_run([b.block_hash]) == 1]


def test_put_then_get_run_restores_the_pool_tensor_exactly(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    blocks = make_blocks(6)
    tier = RedisTier(redis_client, tiny_fmt, BIG)
    assert tier.put(blocks) == 6
    tier.check_integrity()
    run = tier.get_run(hashes(blocks), tokens(blocks))
    assert run == blocks
    target = KVCache(TINY_LAYOUT, num_blocks=6, device="cpu")
    for b, block in enumerate(run):
        raw = torch.frombuffer(bytearray(block.kv), dtype=torch.float32).view(tiny_fmt.shape)
        target.tensor[:, :, b * 16 : (b + 1) * 16] = raw
    for b, block in enumerate(blocks):
        assert target.tensor[:, :, b * 16 : (b + 1) * 16].contiguous().numpy().tobytes() == block.kv
    stats = tier.stats()
    assert (stats.packs, stats.blocks_written, stats.read_hits, stats.read_misses) == (1, 6, 6, 0)
    assert (
        stats.bytes_stored
        == stats.bytes_written
        == stats.bytes_read
        == redis_client.strlen(pack_of(redis_client, tier, blocks[0]))
    )


def test_default_blocks_per_pack(redis_client: redis.Redis, tiny_fmt: KVFormat) -> None:
    smollm2 = KVFormat("smollm2", "float32", (30, 2, 16, 3, 64))
    assert smollm2.nbytes == 737_280
    assert RedisTier(redis_client, smollm2, BIG).blocks_per_pack == 2
    assert RedisTier(redis_client, tiny_fmt, BIG).blocks_per_pack == 256
    assert RedisTier(redis_client, tiny_fmt, BIG, target_pack_bytes=20_000).blocks_per_pack == 2
    assert RedisTier(redis_client, smollm2, BIG, target_pack_bytes=1).blocks_per_pack == 1
    with pytest.raises(ValueError):
        RedisTier(redis_client, tiny_fmt, BIG, blocks_per_pack=0)


def test_seven_blocks_by_three_make_three_packs(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    blocks = make_blocks(7)
    tier = RedisTier(redis_client, tiny_fmt, BIG, blocks_per_pack=3)
    assert tier.put(blocks) == 7
    tier.check_integrity()
    packs = [pack_of(redis_client, tier, b) for b in blocks]
    assert packs == [packs[0]] * 3 + [packs[3]] * 3 + [packs[6]]
    assert len(set(packs)) == 3
    k = tier.keys
    namespace = {s.encode() for s in (k.index, k.lru, k.bytes, k.packs, k.counters, TIER_REGISTRY)}
    assert set(redis_client.keys("*")) == namespace | set(packs)
    assert redis_client.hlen(k.index) == 7 and redis_client.zcard(k.lru) == 3
    sizes = [redis_client.strlen(p) for p in dict.fromkeys(packs)]
    assert int(redis_client.get(k.bytes) or 0) == sum(sizes) == tier.stats().bytes_stored
    assert tier.get_run(hashes(blocks)) == blocks


def test_blocks_are_written_once(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    blocks = make_blocks(10)
    tier = RedisTier(redis_client, tiny_fmt, BIG, blocks_per_pack=3)
    assert tier.put(blocks[:7]) == 7
    before = {key: redis_client.get(key) for key in redis_client.keys(tier.keys.pack_pattern)}
    assert tier.put(blocks[:7]) == 0
    assert tier.put(blocks[2:5] + blocks[2:5]) == 0
    assert tier.put(blocks) == 3  # only 7, 8, 9: one new pack
    tier.check_integrity()
    after = {key: redis_client.get(key) for key in redis_client.keys(tier.keys.pack_pattern)}
    assert len(after) == 4 and all(after[key] == value for key, value in before.items())
    assert tier.stats().blocks_written == 10
    assert tier.get_run(hashes(blocks)) == blocks


def test_lost_index_entries_are_restored_without_rewriting_the_pack(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    blocks = make_blocks(2)
    tier = RedisTier(redis_client, tiny_fmt, BIG, blocks_per_pack=2)
    tier.put(blocks)
    bytes_before = tier.stats().bytes_stored
    redis_client.hdel(tier.keys.index, *hashes(blocks))  # as if another writer's pack took them
    assert tier.put(blocks) == 0  # the same pack key: SET NX is a no-op, the entries come back
    assert tier.stats().bytes_stored == bytes_before and tier.stats().packs == 1
    assert tier.get_run(hashes(blocks)) == blocks
    tier.check_integrity()


def test_new_blocks_between_stored_ones_are_packed_by_runs(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    blocks = make_blocks(6)
    tier = RedisTier(redis_client, tiny_fmt, BIG, blocks_per_pack=4)
    tier.put([blocks[2]])
    assert tier.put(blocks) == 5
    packs = [pack_of(redis_client, tier, b) for b in blocks]
    assert packs[0] == packs[1] and packs[3] == packs[4] == packs[5]
    assert len(set(packs)) == 3
    tier.check_integrity()


def test_get_run_stops_at_a_missing_middle_block(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    blocks = make_blocks(6)
    tier = RedisTier(redis_client, tiny_fmt, BIG, blocks_per_pack=2)
    tier.put(blocks[:3])
    tier.put(blocks[4:])
    assert tier.contains_run(hashes(blocks)) == 3
    assert tier.get_run(hashes(blocks)) == blocks[:3]
    assert tier.get_run(hashes(blocks[3:])) == []
    assert tier.get_run(hashes(blocks[4:])) == blocks[4:]
    assert tier.get_run([]) == []
    stats = tier.stats()
    assert (stats.read_hits, stats.read_misses) == (5, 6)
    assert stats.blocks_read == 3 + 2  # packs 0-1 and 2, then 4-5


def test_token_mismatch_is_a_miss_and_deletes_nothing(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    blocks = make_blocks(4)
    tier = RedisTier(redis_client, tiny_fmt, BIG)
    tier.put(blocks)
    wrong = tokens(blocks)
    wrong[2] = (1, *wrong[2][1:])
    assert tier.get_run(hashes(blocks), wrong) == blocks[:2]
    assert tier.get_run(hashes(blocks), tokens(blocks)) == blocks
    assert tier.stats().packs_dropped == 0
    with pytest.raises(ValueError):
        tier.get_run(hashes(blocks), tokens(blocks)[:3])


def test_flipped_byte_in_redis_cuts_the_run_and_deletes_the_pack(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    blocks = make_blocks(6)
    tier = RedisTier(redis_client, tiny_fmt, BIG, blocks_per_pack=2)
    tier.put(blocks)
    bad_pack = pack_of(redis_client, tier, blocks[3])
    bytes_before = tier.stats().bytes_stored
    data = redis_client.get(bad_pack)
    assert isinstance(data, bytes)
    offset = data.find(blocks[3].kv) + 100
    redis_client.setrange(bad_pack, offset, bytes([data[offset] ^ 0x01]))
    assert tier.get_run(hashes(blocks)) == blocks[:3]  # block 2 was valid, block 3 is not
    assert redis_client.exists(bad_pack) == 0
    assert tier.contains_run(hashes(blocks)) == 2
    stats = tier.stats()
    assert (stats.packs_dropped, stats.packs) == (1, 2)
    assert stats.bytes_stored == bytes_before - len(data)
    tier.check_integrity()
    assert tier.put(blocks) == 2  # the next writer restores it
    assert tier.get_run(hashes(blocks)) == blocks


def test_garbage_pack_in_redis_is_dropped(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    blocks = make_blocks(4)
    tier = RedisTier(redis_client, tiny_fmt, BIG, blocks_per_pack=2)
    tier.put(blocks)
    redis_client.set(pack_of(redis_client, tier, blocks[0]), b"\x93garbage")
    assert tier.get_run(hashes(blocks)) == []
    assert tier.stats().packs_dropped == 1
    assert held(tier, blocks) == [2, 3]
    tier.check_integrity()  # the counter dropped the size the pack was written with


def test_pack_of_another_fingerprint_under_our_key_is_dropped(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    blocks = make_blocks(2)
    tier = RedisTier(redis_client, tiny_fmt, BIG)
    tier.put(blocks)
    other = dataclasses.replace(tiny_fmt, model_fingerprint="other-model")
    redis_client.set(pack_of(redis_client, tier, blocks[0]), encode_pack(other, blocks))
    assert tier.get_run(hashes(blocks)) == []
    assert tier.stats().packs_dropped == 1
    assert held(tier, blocks) == []
    tier.check_integrity()


def test_same_fingerprint_other_dtype_is_foreign(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    blocks = make_blocks(3)
    fp16 = dataclasses.replace(tiny_fmt, dtype="float16")
    writer = RedisTier(redis_client, fp16, BIG)
    assert writer.put([dataclasses.replace(b, kv=b.kv[: fp16.nbytes]) for b in blocks]) == 3
    tier = RedisTier(redis_client, tiny_fmt, BIG)
    assert tier.get_run(hashes(blocks)) == []
    assert tier.stats().packs_dropped == 1
    tier.check_integrity()
    assert tier.put(blocks) == 3
    assert tier.get_run(hashes(blocks)) == blocks


def test_index_entry_of_a_vanished_pack_is_cleaned(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    blocks = make_blocks(4)
    tier = RedisTier(redis_client, tiny_fmt, BIG, blocks_per_pack=2)
    tier.put(blocks)
    redis_client.delete(pack_of(redis_client, tier, blocks[2]))  # e.g. a flush by hand
    assert tier.get_run(hashes(blocks)) == blocks[:2]
    tier.check_integrity()
    assert tier.stats().packs_dropped == 0
    assert tier.put(blocks) == 2


def test_byte_cap_evicts_least_recently_used_packs_exactly(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    a, b, c, d, e = make_blocks(5)
    size = len(encode_pack(tiny_fmt, [a]))
    assert {len(encode_pack(tiny_fmt, [x])) for x in (b, c, d, e)} == {size}
    tier = RedisTier(redis_client, tiny_fmt, 3 * size, blocks_per_pack=1)
    for block in (a, b, c):
        tier.put([block])
    assert tier.get_run([a.block_hash]) == [a]  # a is now the most recent
    tier.put([d])
    assert held(tier, [a, b, c, d]) == [0, 2, 3]  # b went
    tier.check_integrity()
    tier.put([e])
    assert held(tier, [a, b, c, d, e]) == [0, 3, 4]  # then c
    stats = tier.stats()
    assert (stats.packs_evicted, stats.packs, stats.bytes_stored) == (2, 3, 3 * size)
    tier.check_integrity()


def _execs(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_exec", {}).get("calls", 0))


def test_a_large_put_goes_in_transactions_of_a_few_packs(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each MULTI/EXEC carries at most redis_tier.TX_BYTES of packs (at least one pack), each with
    its own index entries: all of a put lands, the index and byte count exact, and the byte cap
    still evicts the put's tail first."""
    blocks = make_blocks(7)
    pack = len(encode_pack(tiny_fmt, blocks[:3]))
    monkeypatch.setattr(redis_tier, "TX_BYTES", 2 * pack)  # two packs of three blocks a transaction
    tier = RedisTier(redis_client, tiny_fmt, BIG, blocks_per_pack=3)
    before = _execs(redis_client)
    assert tier.put(blocks) == 7
    assert _execs(redis_client) - before == 2
    tier.check_integrity()
    assert tier.get_run(hashes(blocks)) == blocks
    assert tier.stats().blocks_written == 7

    redis_client.flushdb()
    monkeypatch.setattr(redis_tier, "TX_BYTES", 1)  # below one pack: one pack a transaction
    one = len(encode_pack(tiny_fmt, blocks[:1]))
    capped = RedisTier(redis_client, tiny_fmt, 2 * one, blocks_per_pack=1)
    before = _execs(redis_client)
    assert capped.put(blocks[:5]) == 5  # written, then the tail evicted, as in one transaction
    assert _execs(redis_client) - before == 5
    assert held(capped, blocks[:5]) == [0, 1]
    capped.check_integrity()


def test_byte_cap_in_one_put_keeps_the_prefix(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    blocks = make_blocks(5)
    size = len(encode_pack(tiny_fmt, blocks[:1]))
    tier = RedisTier(redis_client, tiny_fmt, 2 * size, blocks_per_pack=1)
    assert tier.put(blocks) == 5  # written, then the tail evicted
    assert held(tier, blocks) == [0, 1]
    assert tier.get_run(hashes(blocks)) == blocks[:2]
    tier.check_integrity()


def test_pinned_packs_survive_the_cap_until_released(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    a, b, c, d, e = make_blocks(5)
    size = len(encode_pack(tiny_fmt, [a]))
    loader = RedisTier(redis_client, tiny_fmt, BIG, blocks_per_pack=1)
    loader.put([a, b, c, d])
    loader.pin_session("t", "s1", [a.block_hash, b.block_hash])
    loader.pin_session("t", "s2", [b.block_hash, e.block_hash])  # e is not stored: ignored
    loader.check_integrity()
    assert loader.pinned_bytes_by_tenant() == {"t": 3 * tiny_fmt.nbytes}
    tier = RedisTier(redis_client, tiny_fmt, 3 * size, blocks_per_pack=1)  # another worker, a tighter cap
    assert tier.put([e]) == 1
    assert held(tier, [a, b, c, d, e]) == [0, 1, 4]  # d, then c went; a and b are pinned
    assert tier.stats().packs_evicted == 2
    tier.check_integrity()
    assert tier.release_session("t", "s1") == 2  # a is evictable now; b is still s2's
    assert tier.release_session("t", "s1") == 0  # idempotent
    assert held(tier, [a, b, e]) == [0, 1, 2]  # the cap holds: nothing had to go yet
    tier.put([c])  # over the cap: the oldest unpinned pack (a) goes, b stays pinned
    assert held(tier, [a, b, c, e]) == [1, 2, 3]
    tier.check_integrity()
    tier.release_session("t", "s2")
    assert redis_client.exists(tier.keys.block_pins, tier.keys.tenant_bytes, tier.keys.owner_bytes) == 0
    assert tier.pinned_bytes_by_tenant() == {}
    tier.check_integrity()


def test_contains_run(redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks) -> None:
    blocks = make_blocks(5)
    tier = RedisTier(redis_client, tiny_fmt, BIG, blocks_per_pack=2)
    tier.put(blocks[:3])
    assert tier.contains_run(hashes(blocks)) == 3
    assert tier.contains_run(hashes(blocks[1:])) == 2
    assert tier.contains_run(hashes(blocks[3:])) == 0
    assert tier.contains_run([]) == 0


def test_clear_deletes_only_this_models_keys(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    blocks = make_blocks(4)
    tier = RedisTier(redis_client, tiny_fmt, BIG, blocks_per_pack=1)
    other = RedisTier(redis_client, dataclasses.replace(tiny_fmt, model_fingerprint="tiny-test:v2"), BIG)
    tier.put(blocks)
    tier.pin_session("t", "s", hashes(blocks))
    other.put(blocks)
    assert other.get_run(hashes(blocks)) == blocks  # each model has its own copy
    redis_client.set("kvferry:job:x:meta", b"1")
    tier.clear()
    assert redis_client.keys(tier.keys.pattern) == []
    assert tier.get_run(hashes(blocks)) == [] and tier.stats().bytes_stored == 0
    assert other.get_run(hashes(blocks)) == blocks
    assert redis_client.get("kvferry:job:x:meta") == b"1"
    other.check_integrity()


def test_models_do_not_see_each_others_blocks(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    blocks = make_blocks(2)
    RedisTier(redis_client, tiny_fmt, BIG).put(blocks)
    other = RedisTier(redis_client, dataclasses.replace(tiny_fmt, model_fingerprint="other"), BIG)
    assert other.contains_run(hashes(blocks)) == 0
    assert other.get_run(hashes(blocks)) == []


def test_bad_arguments_are_refused_and_write_nothing(
    redis_client: redis.Redis, redis_server: object, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    blocks = make_blocks(3)
    tier = RedisTier(redis_client, tiny_fmt, BIG, blocks_per_pack=1)
    with pytest.raises(ValueError):
        tier.put([blocks[0], dataclasses.replace(blocks[1], kv=blocks[1].kv[:-1]), blocks[2]])
    with pytest.raises(ValueError):
        tier.put([dataclasses.replace(blocks[0], token_ids=(1, 2))])
    assert redis_client.keys("*") == []
    assert tier.put([]) == 0
    url = redis_client.connection_pool.connection_kwargs
    text_client = redis.Redis(host=url["host"], port=url["port"], decode_responses=True)
    with pytest.raises(ValueError, match="decode_responses"):
        RedisTier(text_client, tiny_fmt, BIG)
    for bad in ("", "a*b", "a{b}", "with space", "q?"):
        with pytest.raises(ValueError):
            TierKeys(bad)


def test_concurrent_writers_keep_the_counter_exact(
    redis_server: object, redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    blocks = make_blocks(40)
    kwargs = redis_client.connection_pool.connection_kwargs
    tiers = [
        RedisTier(redis.Redis(host=kwargs["host"], port=kwargs["port"]), tiny_fmt, BIG, blocks_per_pack=2)
        for _ in range(4)
    ]
    errors: list[BaseException] = []

    def write(tier: RedisTier, start: int) -> None:
        try:
            for i in range(start, start + 40, 3):
                tier.put([blocks[j % 40] for j in range(i, i + 5)])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(t, 5 * n)) for n, t in enumerate(tiers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    tiers[0].check_integrity()
    assert tiers[0].get_run(hashes(blocks)) == blocks
    assert sum(t.stats().blocks_written for t in tiers) >= 40


def test_reads_in_several_mgets_fetch_ahead_and_stop_at_a_missing_pack(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MGETs of one pack each: the next is fetched on the helper thread while this one decodes."""
    monkeypatch.setattr("kvstore.redis.fetch._MAX_MGET_BYTES", 2 * tiny_fmt.nbytes)
    blocks = make_blocks(9)
    tier = RedisTier(redis_client, tiny_fmt, BIG, blocks_per_pack=2)
    assert tier.put(blocks) == 9
    assert tier.get_run(hashes(blocks), tokens(blocks)) == blocks
    assert tier.fetcher.fetched_ahead  # several MGETs went through the helper thread
    redis_client.delete(pack_of(redis_client, tier, blocks[4]))  # as Redis evicts one
    assert tier.get_run(hashes(blocks)) == blocks[:4]
    assert tier.contains_run(hashes(blocks)) == 4  # the stale index entries went
    tier.check_integrity()


def test_packs_under_the_old_key_layout_still_read(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    """Packs were once named inside the tier's prefix (one slot with the metadata); the index
    stores each pack's key, so a tier written then still reads, repairs and evicts."""
    blocks = make_blocks(4)
    tier = RedisTier(redis_client, tiny_fmt, BIG, blocks_per_pack=4)
    assert tier.put(blocks) == 4
    new = pack_of(redis_client, tier, blocks[0])
    assert new.startswith(b"kvferry:kv:pack:{")  # its digest is its hash tag
    old = (tier.keys.prefix + "pack:" + new.decode().split("{")[1].split("}")[0]).encode()
    k = tier.keys
    meta = redis_client.hget(k.packs, new)
    pipe = redis_client.pipeline(transaction=True)
    pipe.rename(new, old)
    pipe.hset(k.index, mapping={b.block_hash: old for b in blocks})
    pipe.zadd(k.lru, {old: 1.0})
    pipe.zrem(k.lru, new)
    pipe.hset(k.packs, old, meta)  # type: ignore[arg-type]
    pipe.hdel(k.packs, new)
    pipe.execute()
    tier.check_integrity()
    assert tier.get_run(hashes(blocks), tokens(blocks)) == blocks
    small = RedisTier(redis_client, tiny_fmt, 1, blocks_per_pack=4)
    assert small.put(make_blocks(4, seed=9)) == 4  # evicts the old pack (and the new one: cap 1)
    assert not redis_client.exists(old)
    tier.check_integrity()
