"""vLLM's POST /tokenize and /detokenize, with the served model's tokenizer (api/tokenizer.py),
behind the tenant key like the /v1 routes. Tokenizing is CPU work that holds no lock of ours: it
runs on a worker thread, never on the event loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import anyio.to_thread
from fastapi import APIRouter, Request

from api import intake
from api.auth import Tenant
from api.context import ApiContext, Ctx
from api.errors import ApiError
from api.schema.openai import chat_messages
from api.schema.openapi_doc import body_of
from api.schema.tokenize import (
    DetokenizeBody,
    TokenizeChatBody,
    TokenizeCompletionBody,
    tokenize_model,
)
from api.schema.validation import validate
from api.tokenizer import Tokenizer, TokenizerUnavailableError
from broker.errors import UnknownModelError

router = APIRouter()
T = TypeVar("T")


def _check_model(ctx: ApiContext, model: str | None) -> None:
    served = ctx.config.served_models
    if model is not None and model not in served:
        raise UnknownModelError(f"The model `{model}` does not exist (served: {', '.join(served)})")


async def _run(ctx: ApiContext, call: Callable[[Tokenizer], T]) -> T:
    if ctx.tokenizer is None:
        raise ApiError(503, "no tokenizer is configured for this api", "service_unavailable_error")
    tokenizer = ctx.tokenizer
    try:
        return await anyio.to_thread.run_sync(call, tokenizer)
    except TokenizerUnavailableError as exc:
        raise ApiError(503, f"the tokenizer is unavailable: {exc}", "service_unavailable_error") from exc


@router.post("/tokenize", openapi_extra=body_of(TokenizeCompletionBody, TokenizeChatBody))
async def tokenize(request: Request, ctx: Ctx, tenant: Tenant) -> dict[str, Any]:
    doc = await intake.read_json(request, ctx.config.max_body_bytes)
    body = validate(tokenize_model(doc), doc)
    _check_model(ctx, body.model)

    def ids(t: Tokenizer) -> tuple[list[int], int]:
        if isinstance(body, TokenizeChatBody):
            tokens = t.apply_chat_template(chat_messages(body.messages), body.add_generation_prompt)
        else:
            tokens = t.encode(body.prompt, body.add_special_tokens)
        return tokens, t.max_model_len()

    tokens, max_model_len = await _run(ctx, ids)
    return {"count": len(tokens), "max_model_len": max_model_len, "tokens": tokens}


@router.post("/detokenize", openapi_extra=body_of(DetokenizeBody))
async def detokenize(request: Request, ctx: Ctx, tenant: Tenant) -> dict[str, Any]:
    body = validate(DetokenizeBody, await intake.read_json(request, ctx.config.max_body_bytes))
    _check_model(ctx, body.model)
    return {"prompt": await _run(ctx, lambda t: t.decode(body.tokens))}
