"""Sessions: GET shows what Redis holds for a conversation; DELETE forgets it at once, and the
workers' session sweep releases its pinned blocks within a maintenance interval (they become
ordinary cached blocks; the KV tier is the workers', never the api's). A session belongs to its
tenant: another tenant's session id names nothing here (404), whoever asks."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter

from api.auth import Tenant
from api.context import Ctx
from api.errors import ApiError
from api.routing import fleet
from broker import keys
from broker.messages import SessionRecord
from broker.sessions import store as session_store

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
async def delete_session(session_id: str, ctx: Ctx, tenant: Tenant) -> dict[str, Any]:
    await _record(ctx, session_id, tenant)
    # Expire it now: readers stop seeing it at once, and the next session sweep (any worker's)
    # claims it and releases its pins, as well as whatever a turn still in flight pins after this.
    member = keys.session_member(tenant, session_id)
    mark, when, ttl = session_store.tombstone(tenant, session_id)  # turns in flight stay out
    pipe = ctx.jobs.redis.pipeline(transaction=True)
    pipe.set(mark, when, ex=ttl)
    pipe.zadd(keys.SESSION_EXPIRY, {member: 0}, xx=True)
    pipe.delete(keys.session_tokens(tenant, session_id))
    await pipe.execute()
    return {"id": session_id, "object": "session", "deleted": True}
