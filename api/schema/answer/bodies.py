"""OpenAI response bodies: a completion's choices (with logprobs and echo as asked), its usage,
and the error body."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from api.schema.answer import logprobs as logprobs_body
from api.schema.answer.usage import fan_in_usage
from api.schema.openai import CompletionRequest
from api.tool_calls.answer import message_body
from broker.messages import GenerateResult, TokenLogprob, Usage


def usage_body(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        # where the prompt's KV came from (an extension; OpenAI clients ignore it)
        "kv_sources": {
            "pool": usage.pool_tokens,
            "warm": usage.warm_tokens,
            "redis": usage.redis_tokens,
            "computed": usage.computed_tokens,
        },
        # tokens a redelivered job computed again (0 unless its worker died or its engine failed)
        "recomputed_tokens": usage.recomputed_tokens,
    }


@dataclass(frozen=True, slots=True)
class Choice:
    """One choice's part of an answer: its text and why it ended, with what the request asked
    besides (logprobs; for echo, the prompt's text and logprobs)."""

    text: str
    finish_reason: str
    logprobs: tuple[TokenLogprob, ...] = ()
    prompt_logprobs: tuple[TokenLogprob, ...] = ()
    prompt_text: str = ""

    @classmethod
    def of(cls, r: GenerateResult) -> Choice:
        return cls(r.text, r.finish_reason, r.logprobs, r.prompt_logprobs, r.prompt_text)


def best_of(request: CompletionRequest, candidates: Sequence[Choice]) -> list[Choice]:
    """A prompt's n choices: all its candidates, or the n likeliest of best_of (by the sum of
    their tokens' logprobs, as OpenAI's best_of), likeliest first."""
    if request.best_of <= request.n:
        return list(candidates)
    ranked = sorted(candidates, key=lambda c: -sum(lp.logprob or 0.0 for lp in c.logprobs))
    return ranked[: request.n]


def choice_body(request: CompletionRequest, index: int, choice: Choice) -> dict[str, Any]:
    if request.is_chat:
        lp = logprobs_body.chat_body(choice.logprobs) if request.wants_logprobs else None
        calling = request.tool_calling
        message, finish_reason = message_body(
            calling.tool_parser if calling else None, choice.text, choice.finish_reason
        )
        return {"index": index, "message": message, "logprobs": lp, "finish_reason": finish_reason}
    text = choice.text
    entries = choice.logprobs
    if request.echo:
        text = choice.prompt_text + text
        entries = (*choice.prompt_logprobs, *entries)
    lp = logprobs_body.completion_body(entries) if request.wants_logprobs else None
    return {"index": index, "text": text, "logprobs": lp, "finish_reason": choice.finish_reason}


def response_body(
    request: CompletionRequest, choices: Sequence[Choice], usage: Usage, request_id: str | None = None
) -> dict[str, Any]:
    chat = request.is_chat
    return {
        "id": request_id or f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": request.model,
        "choices": [choice_body(request, i, c) for i, c in enumerate(choices)],
        "usage": usage_body(usage),
    }


def fanned_body(
    request: CompletionRequest, sizes: Sequence[int], results: Sequence[GenerateResult], response_id: str
) -> dict[str, Any]:
    """One body from the jobs a request fanned out to (`sizes`: jobs per prompt, in order): each
    prompt's choices (best_of's n best), one usage over them all."""
    per_prompt, at = [], 0
    for size in sizes:
        per_prompt.append(results[at : at + size])
        at += size
    choices = [c for group in per_prompt for c in best_of(request, [Choice.of(r) for r in group])]
    usage = fan_in_usage([[r.usage for r in group] for group in per_prompt])
    return response_body(request, choices, usage, response_id)


def error_body(
    message: str, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
