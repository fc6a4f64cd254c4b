"""Session records in Redis (sync side: workers, CLI). Expiry is tracked in a sorted set as well
as by the key's TTL, so whoever sweeps can release what an expired session held."""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from broker import keys
from broker.codec import CodecError, from_wire, to_wire
from broker.messages import SessionRecord

SWEEP_GRACE_S = 3600  # the record outlives its expiry this long, for the sweep to release its pins


def save(client: redis.Redis, record: SessionRecord, ttl_s: int) -> None:
    pipe = client.pipeline(transaction=True)
    pipe.set(keys.session(record.session_id), json.dumps(to_wire(record)), ex=ttl_s + SWEEP_GRACE_S)
    pipe.zadd(keys.SESSION_EXPIRY, {record.session_id: time.time() + ttl_s})
    pipe.execute()


def is_live(client: redis.Redis, session_id: str, now: float | None = None) -> bool:
    expiry: Any = client.zscore(keys.SESSION_EXPIRY, session_id)
    return expiry is not None and float(expiry) > (now or time.time())


def load(client: redis.Redis, session_id: str) -> SessionRecord | None:
    """The live session's record; None when unknown, expired or forgotten."""
    if not is_live(client, session_id):
        return None
    raw: Any = client.get(keys.session(session_id))
    return decode(raw) if raw is not None else None


def decode(raw: bytes | str) -> SessionRecord | None:
    try:
        return from_wire(SessionRecord, json.loads(raw))
    except (ValueError, CodecError):
        return None  # unreadable: treated as no session (the turn is computed, nothing is lost)


def claim_expired(client: redis.Redis, now: float | None = None) -> list[SessionRecord]:
    """Remove the sessions whose time is up (or that were forgotten) and return their records, each
    to exactly one caller (ZREM decides), so their pins are released once."""
    ids: Any = client.zrangebyscore(keys.SESSION_EXPIRY, 0, now or time.time())
    claimed = []
    for raw_id in ids:
        session_id = raw_id.decode()
        if client.zrem(keys.SESSION_EXPIRY, session_id) != 1:
            continue  # another worker claimed it
        raw: Any = client.getdel(keys.session(session_id))
        record = decode(raw) if raw is not None else None
        if record is not None:
            claimed.append(record)
    return claimed
