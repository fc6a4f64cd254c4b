"""Session records in Redis (sync side: workers, CLI), each in its tenant's namespace: a session
is named by (tenant, session id), so tenant B's turn with A's session id is B's own session.
Expiry is tracked in a sorted set as well as by the key's TTL, so whoever sweeps can release what
an expired session held."""

from __future__ import annotations

import time
from typing import Any

import redis
import redis.asyncio as aioredis

from broker import codec, keys
from broker.messages import GenerateJob, SessionRecord
from broker.sessions import tokens as session_tokens
from broker.sessions.tokens import SessionTokens

SWEEP_GRACE_S = 3600  # the record outlives its expiry this long, for the sweep to release its pins
TOMBSTONE_TTL_S = 86400  # longer than any turn may run: one that began before a DELETE stays out

# Newer wins: two turns of one session may finish in either order on two workers; the record of
# the turn that finished last (last_used) stays, as its pins do (kvstore/redis/lua/pin_owner.lua). A
# turn that began before the session was deleted does not bring it back.
# KEYS: record, expiry zset, tombstone, exact tokens; ARGV: json, last_used, ttl with grace,
# member, expires at, when the turn began, the tokens' blob ('' = none: the old one goes).
# The old record is parsed as JSON (whatever its layout); one that does not parse is replaced.
_SAVE = """
local deleted = redis.call('GET', KEYS[3])
if deleted and tonumber(deleted) >= tonumber(ARGV[6]) then return 0 end
local old = redis.call('GET', KEYS[1])
if old then
  local ok, doc = pcall(cjson.decode, old)
  local last = ok and type(doc) == 'table' and tonumber(doc['last_used']) or nil
  if last and last > tonumber(ARGV[2]) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[4])
if ARGV[7] ~= '' then redis.call('SET', KEYS[4], ARGV[7], 'EX', ARGV[3]) else redis.call('DEL', KEYS[4]) end
return 1
"""


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
    member = keys.session_member(record.tenant, record.session_id)
    saved = client.register_script(_SAVE)(
        keys=[
            keys.session(record.tenant, record.session_id),
            keys.SESSION_EXPIRY,
            keys.session_deleted(record.tenant, record.session_id),
            keys.session_tokens(record.tenant, record.session_id),
        ],
        args=[
            codec.encode(record),
            repr(record.last_used),
            ttl_s + SWEEP_GRACE_S,
            member,
            repr(time.time() + ttl_s),
            repr(record.last_used if began is None else began),
            session_tokens.encode(tokens) if tokens is not None else b"",
        ],
    )
    return bool(saved)


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
