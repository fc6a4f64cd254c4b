"""Session records in Redis (sync side: workers, CLI), each in its tenant's namespace: a session
is named by (tenant, session id), so tenant B's turn with A's session id is B's own session.
Expiry is tracked in a sorted set as well as by the key's TTL, so whoever sweeps can release what
an expired session held."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aioredis

from broker import codec, keys
from broker.messages import GenerateJob, SessionRecord
from broker.redis.lua import Script
from broker.sessions import tokens as session_tokens
from broker.sessions.tokens import SessionTokens

SWEEP_GRACE_S = 3600  # the record outlives its expiry this long, for the sweep to release its pins
TOMBSTONE_TTL_S = 86400  # longer than any turn may run: one that began before a DELETE stays out

_SAVE = Script(__file__, "save")  # newer wins: lua/save.lua


@dataclass(frozen=True, slots=True)
class SessionSave:
    """KEYS and ARGV of lua/save.lua: a turn's record and exact tokens, written together or not."""

    record: SessionRecord
    ttl_s: int
    began: float  # when the turn began: a DELETE after it keeps the record out
    tokens: SessionTokens | None = None

    def keys(self) -> list[str]:
        tenant, session_id = self.record.tenant, self.record.session_id
        return [
            keys.session(tenant, session_id),
            keys.SESSION_EXPIRY,
            keys.session_deleted(tenant, session_id),
            keys.session_tokens(tenant, session_id),
        ]

    def args(self) -> list[Any]:
        record = self.record
        return [
            codec.encode(record),
            repr(record.last_used),
            self.ttl_s + SWEEP_GRACE_S,
            keys.session_member(record.tenant, record.session_id),
            repr(time.time() + self.ttl_s),
            repr(self.began),
            session_tokens.encode(self.tokens) if self.tokens is not None else b"",
        ]


def save(
    client: redis.Redis,
    record: SessionRecord,
    ttl_s: int,
    began: float | None = None,
    tokens: SessionTokens | None = None,
) -> bool:
    """Store the record under its tenant, with the turn's exact tokens (same fate: written together
    or not at all); False when a newer turn's record is already there, or the session was deleted
    after this turn began (`began`, default: record.last_used)."""
    began = record.last_used if began is None else began
    return bool(_SAVE.run(client, SessionSave(record, ttl_s, began, tokens)))


def tombstone(tenant: str, session_id: str, now: float | None = None) -> tuple[str, str, int]:
    """(key, value, ttl) of the mark a DELETE leaves (written by the sync and the async side)."""
    return keys.session_deleted(tenant, session_id), repr(now or time.time()), TOMBSTONE_TTL_S


def is_live(client: redis.Redis, tenant: str, session_id: str, now: float | None = None) -> bool:
    expiry: Any = client.zscore(keys.SESSION_EXPIRY, keys.session_member(tenant, session_id))
    return expiry is not None and float(expiry) > (now or time.time())


def load(client: redis.Redis, tenant: str, session_id: str) -> SessionRecord | None:
    """The live session's record; None when unknown, expired, forgotten or another tenant's."""
    if not is_live(client, tenant, session_id):
        return None
    raw: Any = client.get(keys.session(tenant, session_id))
    record = decode(raw) if raw is not None else None
    return record if record is not None and record.tenant == tenant else None


async def continued(client: aioredis.Redis, job: GenerateJob) -> SessionRecord | None:
    """The record of the session `job` continues (its tenant's, for its model), if any."""
    if not job.session_id:
        return None
    raw: Any = await client.get(keys.session(job.tenant, job.session_id))
    record = decode(raw) if raw is not None else None
    if record is None or record.tenant != job.tenant or record.model != job.model:
        return None
    return record


def load_tokens(client: redis.Redis, tenant: str, session_id: str) -> SessionTokens | None:
    """The live session's exact tokens (one round trip); None when unknown, expired or deleted."""
    pipe = client.pipeline(transaction=False)
    pipe.zscore(keys.SESSION_EXPIRY, keys.session_member(tenant, session_id))
    pipe.get(keys.session_tokens(tenant, session_id))
    expiry, raw = pipe.execute()
    if expiry is None or float(expiry) <= time.time() or raw is None:
        return None
    return session_tokens.decode(raw)


def decode(raw: bytes | str) -> SessionRecord | None:
    try:
        return codec.decode(raw, SessionRecord)
    except codec.CodecError:
        return None  # unreadable: treated as no session (the turn is computed, nothing is lost)


def delete(client: redis.Redis, tenant: str, session_id: str) -> bool:
    """Expire the session now (readers stop seeing it at once); the sweep still claims it, so its
    pins are released again if a turn pinned after the caller released them. False if not live."""
    if not is_live(client, tenant, session_id):
        return False
    key, value, ttl = tombstone(tenant, session_id)
    pipe = client.pipeline(transaction=True)
    pipe.set(key, value, ex=ttl)
    pipe.zadd(keys.SESSION_EXPIRY, {keys.session_member(tenant, session_id): 0}, xx=True)
    pipe.delete(keys.session_tokens(tenant, session_id))
    pipe.execute()
    return True


def claim_expired(client: redis.Redis, now: float | None = None) -> list[tuple[str, str]]:
    """Remove the sessions whose time is up (or that were forgotten) and return their (tenant,
    session id), each to exactly one caller (ZREM decides), so their pins are released once."""
    members: Any = client.zrangebyscore(keys.SESSION_EXPIRY, 0, now or time.time())
    claimed = []
    for raw in members:
        member = raw.decode()
        if client.zrem(keys.SESSION_EXPIRY, member) != 1:
            continue  # another worker claimed it
        try:
            tenant, session_id = keys.parse_session_member(member)
        except ValueError:
            continue  # not ours (an entry of an older format): nothing of it can be found
        client.delete(keys.session(tenant, session_id), keys.session_tokens(tenant, session_id))
        claimed.append((tenant, session_id))
    return claimed
