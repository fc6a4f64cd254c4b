"""Bearer-key auth, and the tenant a key stands for (the KV cache salt of its jobs)."""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated

from fastapi import Depends, Request

from api.context import Ctx
from api.errors import ApiError


def tenant_of(api_key: str) -> str:
    """A stable name for the key's tenant that does not reveal the key."""
    return "key-" + hashlib.sha256(api_key.encode()).hexdigest()[:16]


def require_tenant(request: Request, ctx: Ctx) -> str:
    """The caller's tenant: empty when auth is off; else from a valid key, or 401."""
    key = ctx.config.api_key
    if key is None:
        return ""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise ApiError(
            401, "Incorrect or missing API key (Authorization: Bearer <key>)", code="invalid_api_key"
        )
    return tenant_of(key)


Tenant = Annotated[str, Depends(require_tenant)]
