"""Sessions: GET shows what Redis holds for a conversation; DELETE forgets it (its pinned blocks
are released by the next worker sweep and become ordinary cached blocks)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter

from api import fleet
from api.auth import Tenant
from api.context import Ctx
from api.errors import ApiError
from broker import keys, session_store
from broker.messages import SessionRecord

router = APIRouter(prefix="/v1/sessions")


async def _record(ctx: Ctx, session_id: str, tenant: str) -> tuple[SessionRecord, float]:
    client = ctx.jobs.redis
    expiry: Any = await client.zscore(keys.SESSION_EXPIRY, session_id)
    raw: Any = await client.get(keys.session(session_id))
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
    # Expire it now: readers stop seeing it at once; a worker's sweep releases its pins.
    await ctx.jobs.redis.zadd(keys.SESSION_EXPIRY, {session_id: 0}, xx=True)
    return {"id": session_id, "object": "session", "deleted": True}
