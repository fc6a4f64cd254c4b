"""The OpenAPI document: the completion and tokenize routes read their raw body (to bound its
size and depth before parsing), so FastAPI cannot see their models; they are declared here
instead, from the same pydantic models that validate the bodies (api/schema/requests.py,
api/schema/tokenize.py)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from api.schema.requests import ChatBody, CompletionBody, JobBody
from api.schema.tokenize import DetokenizeBody, TokenizeChatBody, TokenizeCompletionBody

REF = "#/components/schemas/{model}"
MODELS: tuple[type[BaseModel], ...] = (
    ChatBody,
    CompletionBody,
    JobBody,
    TokenizeCompletionBody,
    TokenizeChatBody,
    DetokenizeBody,
)


def body_of(*models: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a route whose JSON body is one of `models`."""
    refs = [{"$ref": REF.format(model=m.__name__)} for m in models]
    schema = refs[0] if len(refs) == 1 else {"anyOf": refs}
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
