"""The OpenAPI document: the completion routes read their raw body (to bound its size and depth
before parsing), so FastAPI cannot see their models; they are declared here instead, from the
same pydantic models that validate the bodies (api/schema/requests.py)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from api.schema.requests import ChatBody, CompletionBody, JobBody

REF = "#/components/schemas/{model}"
MODELS: tuple[type[BaseModel], ...] = (ChatBody, CompletionBody, JobBody)


def body_of(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a route whose JSON body is `model`."""
    schema = {"$ref": REF.format(model=model.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def install(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
            _, defs = models_json_schema([(m, "validation") for m in MODELS], ref_template=REF)
            doc.setdefault("components", {}).setdefault("schemas", {}).update(defs.get("$defs", {}))
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
