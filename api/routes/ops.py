"""Operational routes, open without a tenant's key: /healthz, vLLM's /health and /version, and
/metrics (which takes its own token when KVFERRY_METRICS_TOKEN is set: it names every tenant and
its usage)."""

from __future__ import annotations

import hmac
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from redis import RedisError

from api.context import Ctx
from api.errors import ApiError, error_response
from api.routing import fleet

router = APIRouter()


def _version() -> str:
    try:
        return package_version("kvferry")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


VERSION = _version()


async def _live_workers(ctx: Ctx) -> int | None:
    """Workers with a live heartbeat; None when Redis does not answer."""
    try:
        await ctx.jobs.redis.ping()
        return sum(1 for w in await fleet.workers(ctx.jobs.redis) if w.live)
    except RedisError:
        return None


@router.get("/healthz")
async def healthz(ctx: Ctx) -> JSONResponse:
    live = await _live_workers(ctx)
    if live is None:
        return JSONResponse({"status": "unavailable", "redis": False, "workers": 0}, status_code=503)
    return JSONResponse({"status": "ok", "redis": True, "workers": live})


@router.get("/health")
async def health(ctx: Ctx) -> JSONResponse:
    """vLLM's readiness probe: 200 only when a request could be served now (/healthz, by
    contrast, answers 200 with no worker: the api itself is up)."""
    live = await _live_workers(ctx)
    if live is None:
        return error_response(503, "the queue service (Redis) is unreachable", "service_unavailable_error")
    if live == 0:
        return error_response(503, "no worker is live", "service_unavailable_error")
    return JSONResponse({})


@router.get("/version")
async def version(ctx: Ctx) -> dict[str, Any]:
    """vLLM's version probe, plus the precisions the live workers compute in (their heartbeats:
    dtype, kv_cache_dtype), once one has built its engine."""
    try:
        engines = [w.status.engine for w in await fleet.workers(ctx.jobs.redis) if w.live and w.status]
    except RedisError:
        engines = []
    found = [e for e in engines if e is not None]
    if not found:  # no worker has built its engine yet: the precision is not known
        return {"version": VERSION}
    return {
        "version": VERSION,
        "dtype": sorted({e.dtype for e in found}),
        "kv_cache_dtype": sorted({e.kv_cache_dtype for e in found}),
    }


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
    tier = await ctx.tier.report()
    text = await ctx.metrics.render(ctx.jobs.redis, tenants, tier, ctx.config.dispatch_headroom)
    return Response(text, media_type=CONTENT_TYPE_LATEST)
