"""OpenAI-compatible routes: chat and text completions (JSON or SSE) and the model list."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api import intake, stage_clock
from api.answer.completion import answer
from api.answer.completion_batch import answer_all, submit_all
from api.auth import Tenant
from api.context import Ctx
from api.errors import ApiError
from api.schema.openapi_doc import body_of
from api.schema.requests import ChatBody, CompletionBody
from api.stage_clock import StageClock

router = APIRouter(prefix="/v1")


async def _complete(endpoint: str, request: Request, ctx: Ctx, tenant: str) -> Response:
    clock = StageClock(stage_clock.REQUEST_HEADER in request.headers)
    body = await intake.read_json(request, ctx.config.max_body_bytes)
    parsed = intake.parse(ctx, endpoint, body, request.headers.get(intake.SESSION_HEADER))
    clock.mark("parsed")

    async def alive() -> bool:
        return not await request.is_disconnected()

    if parsed.fans_out:
        groups = parsed.split()
        return await answer_all(ctx, parsed, await submit_all(ctx, groups, tenant), alive)
    meta = await intake.submit(ctx, parsed, tenant, clock)
    return await answer(ctx, meta, parsed, alive, clock)


@router.post("/chat/completions", openapi_extra=body_of(ChatBody))
async def chat_completions(request: Request, ctx: Ctx, tenant: Tenant) -> Response:
    return await _complete("/v1/chat/completions", request, ctx, tenant)


@router.post("/completions", openapi_extra=body_of(CompletionBody))
async def completions(request: Request, ctx: Ctx, tenant: Tenant) -> Response:
    return await _complete("/v1/completions", request, ctx, tenant)


def _model(ctx: Ctx, name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": ctx.started, "owned_by": "kvferry"}


@router.get("/models")
async def list_models(ctx: Ctx, tenant: Tenant) -> dict[str, Any]:
    return {"object": "list", "data": [_model(ctx, m) for m in ctx.config.served_models]}


@router.get("/models/{model:path}")
async def get_model(model: str, ctx: Ctx, tenant: Tenant) -> dict[str, Any]:
    if model not in ctx.config.served_models:
        raise ApiError(404, f"The model `{model}` does not exist", param="model", code="model_not_found")
    return _model(ctx, model)
