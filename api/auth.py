"""Bearer-key auth: the tenant a request's key stands for (see api/tenants.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from api.context import Ctx
from api.errors import ApiError
from api.tenants import tenant_of

__all__ = ["Tenant", "require_tenant", "tenant_of"]


async def require_tenant(request: Request, ctx: Ctx) -> str:
    """The caller's tenant: empty when auth is off; else from a valid key, or 401."""
    tenant = ""
    if ctx.keys.enabled:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        found = ctx.keys.tenant(token.strip()) if scheme.lower() == "bearer" else None
        if found is None:
            raise ApiError(
                401, "Incorrect or missing API key (Authorization: Bearer <key>)", code="invalid_api_key"
            )
        tenant = found
    request.state.tenant = tenant  # for the per-tenant request counter
    return tenant


Tenant = Annotated[str, Depends(require_tenant)]
