"""Operational routes, open without auth: /healthz and /metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from redis import RedisError

from api import fleet
from api.context import Ctx

router = APIRouter()


@router.get("/healthz")
async def healthz(ctx: Ctx) -> JSONResponse:
    try:
        await ctx.jobs.redis.ping()
        live = sum(1 for w in await fleet.workers(ctx.jobs.redis) if w.live)
    except RedisError:
        return JSONResponse({"status": "unavailable", "redis": False, "workers": 0}, status_code=503)
    return JSONResponse({"status": "ok", "redis": True, "workers": live})


@router.get("/metrics")
async def metrics(ctx: Ctx) -> Response:
    tenants = ctx.keys.tenants() if ctx.keys.enabled else [""]
    text = await ctx.metrics.render(ctx.jobs.redis, tenants, await ctx.tier.report())
    return Response(text, media_type=CONTENT_TYPE_LATEST)
