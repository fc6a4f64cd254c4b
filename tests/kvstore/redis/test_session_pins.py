"""Sessions in their tenants' namespaces (broker/session_store) and the tier report that checks
pins against them (kvstore/tier_report): orphan pins are 0 after turns, deletes, expiry and sweeps."""

from __future__ import annotations

import time

import redis

from broker import keys
from broker.messages import SessionRecord
from broker.sessions import store as session_store
from kvstore.layout import KVFormat
from kvstore.redis import pins as tier_pins
from kvstore.redis.report import read_report
from kvstore.redis.tier import RedisTier
from tests.kvstore.conftest import MakeBlocks

BIG = 10**9


def record(tenant: str, session_id: str, last_used: float, tokens: tuple[int, ...] = (1, 2)) -> SessionRecord:
    return SessionRecord(session_id, tenant, "m", tokens, (), "w1", last_used, 1)


def test_sessions_are_scoped_by_tenant(redis_client: redis.Redis) -> None:
    assert session_store.save(redis_client, record("A", "s", 10.0, (1,)), 60)
    assert session_store.save(redis_client, record("B", "s", 11.0, (2,)), 60)  # B's own "s"
    a, b = session_store.load(redis_client, "A", "s"), session_store.load(redis_client, "B", "s")
    assert a is not None and a.token_ids == (1,) and b is not None and b.token_ids == (2,)
    assert session_store.load(redis_client, "C", "s") is None
    assert keys.session("a:b", "c") != keys.session("a", "b:c")
    assert keys.parse_session_member(keys.session_member("a:b", "x:y")) == ("a:b", "x:y")
    assert not session_store.save(redis_client, record("A", "s", 9.0, (9,)), 60)  # older turn: refused
    assert session_store.load(redis_client, "A", "s").token_ids == (1,)  # type: ignore[union-attr]
    assert session_store.delete(redis_client, "A", "s")
    assert session_store.load(redis_client, "A", "s") is None and session_store.load(redis_client, "B", "s")
    assert session_store.claim_expired(redis_client) == [("A", "s")]
    assert session_store.claim_expired(redis_client) == []
    assert redis_client.exists(keys.session("A", "s")) == 0 and redis_client.exists(keys.session("B", "s"))


def test_report_counts_pins_of_live_pending_and_vanished_sessions(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    blocks = make_blocks(4)
    tier = RedisTier(redis_client, tiny_fmt, BIG, blocks_per_pack=2)
    tier.put(blocks)
    hashes = [b.block_hash for b in blocks]
    for tenant in ("A", "B"):
        session_store.save(redis_client, record(tenant, "s", time.time()), 60)
        tier.pin_session(tenant, "s", hashes)
    tier.pin_preload("A", hashes[:1])
    assert tier.get_run(hashes) == blocks
    report = read_report(redis_client, redis_client)
    n = tiny_fmt.nbytes
    assert report["pinned_bytes_by_tenant"] == {"A": 5 * n, "B": 4 * n}
    assert (report["orphan_pins"], report["pending_pins"], report["pinned_sessions"]) == (0, 0, 2)
    assert (report["hits"], report["misses"], report["blocks_written"]) == (4, 0, 4)
    assert report["bytes_read"] == report["bytes_written"] == report["bytes_stored"] > 0
    session_store.delete(redis_client, "B", "s")  # expired, not yet swept: pending
    assert read_report(redis_client, redis_client)["pending_pins"] == 4
    for tenant, session_id in session_store.claim_expired(redis_client):
        tier_pins.release_session(redis_client, tenant, session_id)  # what the sweep does
    tier.pin_session("C", "gone", hashes[:2])  # pins whose session never existed: an orphan
    report = read_report(redis_client, redis_client)
    assert (report["orphan_pins"], report["pending_pins"]) == (2, 0)
    assert report["pinned_bytes_by_tenant"] == {"A": 5 * n, "C": 2 * n}
    assert tier_pins.release_session(redis_client, "C", "gone") == 2
    assert read_report(redis_client, redis_client)["orphan_pins"] == 0
    tier.check_integrity()


def test_save_reads_the_stored_records_last_used_as_json_whatever_its_layout(
    redis_client: redis.Redis,
) -> None:
    """The save script parses the stored record (cjson), so a newer one stored in another layout
    (spaced, keys in another order) still refuses an older turn; one that does not parse goes."""
    key = keys.session("A", "s")
    redis_client.set(key, '{ "turns" : 1 , "last_used" : 12.5, "session_id" : "s" }')
    assert not session_store.save(redis_client, record("A", "s", 12.0), 60)
    assert session_store.save(redis_client, record("A", "s", 13.0), 60)
    redis_client.set(key, b"\x00 not json")
    assert session_store.save(redis_client, record("A", "s", 1.0), 60)
    assert session_store.load(redis_client, "A", "s") == record("A", "s", 1.0)


def test_sessions_pins_and_tier_writes_run_their_scripts_by_sha(
    redis_client: redis.Redis, tiny_fmt: KVFormat, make_blocks: MakeBlocks
) -> None:
    """register_script: EVALSHA on each call, the script's text sent only when Redis lacks it."""
    blocks = make_blocks(4)
    hashes = [b.block_hash for b in blocks]
    redis_client.config_resetstat()
    tier = RedisTier(redis_client, tiny_fmt, BIG, blocks_per_pack=2)
    tier.put(blocks)
    assert session_store.save(redis_client, record("A", "s", time.time()), 60)
    tier.pin_session("A", "s", hashes)
    assert tier_pins.release_session(redis_client, "A", "s") == len(hashes)
    stats = redis_client.info("commandstats")
    assert "cmdstat_eval" not in stats and stats["cmdstat_evalsha"]["calls"] >= 4, stats
