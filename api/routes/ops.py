"""Operational routes, open without a tenant's key: /healthz, and /metrics (which takes its own
token when KVFERRY_METRICS_TOKEN is set: it names every tenant and its usage)."""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from redis import RedisError

from api import fleet
from api.context import Ctx
from api.errors import ApiError

router = APIRouter()


@router.get("/healthz")
async def healthz(ctx: Ctx) -> JSONResponse:
    try:
        await ctx.jobs.redis.ping()
        live = sum(1 for w in await fleet.workers(ctx.jobs.redis) if w.live)
    except RedisError:
        return JSONResponse({"status": "unavailable", "redis": False, "workers": 0}, status_code=503)
    return JSONResponse({"status": "ok", "redis": True, "workers": live})


def _metrics_allowed(request: Request, token: str | None) -> bool:
    if token is None:
        return True
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


@router.get("/metrics")
async def metrics(request: Request, ctx: Ctx) -> Response:
    if not _metrics_allowed(request, ctx.config.metrics_token):
        raise ApiError(
            401, "/metrics needs its token (Authorization: Bearer <token>)", code="invalid_api_key"
        )
    tenants = ctx.keys.tenants() if ctx.keys.enabled else [""]
    text = await ctx.metrics.render(ctx.jobs.redis, tenants, await ctx.tier.report())
    return Response(text, media_type=CONTENT_TYPE_LATEST)
