"""Session records are compact JSON now; records stored by an older kvferry (json.dumps, a space
after each colon) still decode, and the save script still reads their last_used."""

from __future__ import annotations

import json

import msgspec
import redis

from broker import codec, keys
from broker.messages import SessionRecord
from broker.sessions import store as session_store

TTL_S = 600


def _record(last_used: float, turns: int = 1) -> SessionRecord:
    return SessionRecord("s1", "t", "m", (1, 2, 3), ("ab",), "w1", last_used, turns)


def _store_old_format(rds: redis.Redis, record: SessionRecord) -> None:
    """What the reflective codec wrote: json.dumps of the fields, spaces and all."""
    raw = json.dumps(msgspec.to_builtins(record))
    assert '"last_used": ' in raw
    rds.set(keys.session(record.tenant, record.session_id), raw)


def test_records_are_compact_and_round_trip(rds: redis.Redis) -> None:
    record = _record(1000.5)
    assert session_store.save(rds, record, TTL_S)
    raw = rds.get(keys.session("t", "s1"))
    assert raw is not None and b'"last_used":1000.5' in raw
    assert session_store.load(rds, "t", "s1") == record


def test_an_old_format_record_decodes() -> None:
    record = _record(1000.25, turns=4)
    assert session_store.decode(json.dumps(msgspec.to_builtins(record))) == record


def test_the_save_script_reads_last_used_in_either_format(rds: redis.Redis) -> None:
    for store in (_store_old_format, lambda c, r: session_store.save(c, r, TTL_S)):
        rds.flushall()
        store(rds, _record(2000.0, turns=2))
        # an older turn finishing late does not overwrite the newer record
        assert not session_store.save(rds, _record(1999.0, turns=1), TTL_S)
        assert codec.decode(rds.get(keys.session("t", "s1")) or b"", SessionRecord).turns == 2
        # a newer one does
        assert session_store.save(rds, _record(2001.0, turns=3), TTL_S)
        assert codec.decode(rds.get(keys.session("t", "s1")) or b"", SessionRecord).turns == 3


def test_an_unreadable_record_is_no_session() -> None:
    assert session_store.decode(b"not json") is None
    assert session_store.decode(b'{"session_id": "s1"}') is None  # fields missing
