"""Sessions: GET shows what Redis holds for a conversation; DELETE forgets it and releases its
pinned blocks at once (they become ordinary cached blocks). A session belongs to its tenant:
another tenant's session id names nothing here (404), whoever asks."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis
from fastapi import APIRouter, Request

from api import fleet
from api.auth import Tenant
from api.context import Ctx
from api.errors import ApiError
from broker import keys
from broker.messages import SessionRecord
from broker.sessions import store as session_store
from kvstore.redis import pins as tier_pins  # redis only: no torch, no numpy in the API

router = APIRouter(prefix="/v1/sessions")


async def _record(ctx: Ctx, session_id: str, tenant: str) -> tuple[SessionRecord, float]:
    client = ctx.jobs.redis
    expiry: Any = await client.zscore(keys.SESSION_EXPIRY, keys.session_member(tenant, session_id))
    raw: Any = await client.get(keys.session(tenant, session_id))
    record = session_store.decode(raw) if raw is not None else None
    if record is None or expiry is None or float(expiry) <= time.time() or record.tenant != tenant:
        raise ApiError(
            404, f"no session {session_id!r}", "not_found_error", "session_id", "session_not_found"
        )
    return record, float(expiry)


def _kv_client(request: Request, ctx: Ctx) -> redis.Redis:
    """A sync client of the KV Redis, made once: the release runs in a thread, off the event loop."""
    client = getattr(request.app.state, "kv_redis", None)
    if client is None:
        client = redis.Redis.from_url(ctx.config.kv_redis_url or ctx.config.redis_url)
        request.app.state.kv_redis = client
    assert isinstance(client, redis.Redis)
    return client


@router.get("/{session_id}")
async def get_session(session_id: str, ctx: Ctx, tenant: Tenant) -> dict[str, Any]:
    record, expires_at = await _record(ctx, session_id, tenant)
    live = {v.name for v in await fleet.workers(ctx.jobs.redis) if v.live}
    return {
        "id": record.session_id,
        "object": "session",
        "model": record.model,
        "turns": record.turns,
        "tokens": len(record.token_ids),
        "token_ids": list(record.token_ids),
        "blocks": len(record.block_hashes),
        "block_hashes": list(record.block_hashes),
        "last_worker": record.last_worker,
        "last_worker_alive": record.last_worker in live,
        "last_used": record.last_used,
        "expires_at": expires_at,
    }


@router.delete("/{session_id}")
async def delete_session(session_id: str, ctx: Ctx, tenant: Tenant, request: Request) -> dict[str, Any]:
    await _record(ctx, session_id, tenant)
    # Expire it now (readers stop seeing it at once), then release its pins. The record stays for
    # the sweep, which releases again whatever a turn still in flight pins after this.
    member = keys.session_member(tenant, session_id)
    mark, when, ttl = session_store.tombstone(tenant, session_id)  # turns in flight stay out
    pipe = ctx.jobs.redis.pipeline(transaction=True)
    pipe.set(mark, when, ex=ttl)
    pipe.zadd(keys.SESSION_EXPIRY, {member: 0}, xx=True)
    pipe.delete(keys.session_tokens(tenant, session_id))
    await pipe.execute()
    unpinned = await asyncio.to_thread(
        tier_pins.release_session, _kv_client(request, ctx), tenant, session_id
    )
    return {"id": session_id, "object": "session", "deleted": True, "blocks_unpinned": unpinned}
