"""The response object's JSON, as OpenAI's: the request's settings echoed, its status, output
items and usage (input_tokens_details.cached_tokens: prompt tokens kvferry did not compute)."""

from __future__ import annotations

import time
from typing import Any

from api.responses.body import ResponsesBody
from broker.messages import Usage


def usage_body(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
        # where the prompt's KV came from (an extension, as on chat completions)
        "kv_sources": {
            "pool": usage.pool_tokens,
            "warm": usage.warm_tokens,
            "redis": usage.redis_tokens,
            "computed": usage.computed_tokens,
        },
    }


def _tool(t: Any) -> dict[str, Any]:
    return {
        "type": "function",
        "name": t.name,
        "description": t.description,
        "parameters": t.parameters,
        "strict": t.strict if t.strict is not None else True,
    }


def skeleton(body: ResponsesBody, response_id: str, status: str) -> dict[str, Any]:
    """The response before its answer: the settings it runs with."""
    choice = body.tool_choice
    text_format = body.text.format if body.text and body.text.format else None
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "background": bool(body.background),
        "error": None,
        "incomplete_details": None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "model": body.model,
        "output": [],
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "conversation": {"id": body.conversation_id} if body.conversation_id else None,
        "prompt_cache_key": body.prompt_cache_key,
        "store": body.stored,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "text": {
            "format": text_format.model_dump(by_alias=True, exclude_none=True)
            if text_format
            else {"type": "text"}
        },
        "tool_choice": choice.model_dump()
        if choice is not None and not isinstance(choice, str)
        else (choice or "auto"),
        "tools": [_tool(t) for t in body.tools or ()],
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "top_logprobs": body.top_logprobs,
        "truncation": "disabled",
        "usage": None,
        "user": body.user,
        "metadata": body.metadata or {},
    }


def ended(
    body: dict[str, Any], output: list[dict[str, Any]], usage: Usage, finish_reason: str, worker: str
) -> dict[str, Any]:
    incomplete = finish_reason == "length"
    return {
        **body,
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "output": output,
        "usage": usage_body(usage),
        "worker": worker,  # which worker answered (an extension)
    }


def failed(body: dict[str, Any], code: str, message: str) -> dict[str, Any]:
    return {**body, "status": "failed", "error": {"code": code, "message": message}}
