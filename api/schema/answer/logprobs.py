"""Logprobs as OpenAI's response bodies show them: chat's `logprobs.content` entries, and the
legacy completions' parallel lists (tokens, token_logprobs, top_logprobs, text_offset)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from broker.messages import TokenLogprob


def _bytes(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def chat_content(entries: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    """chat.completion's choices[].logprobs.content: each token with its top alternatives."""
    return [
        {
            "token": e.text,
            "logprob": e.logprob,
            "bytes": _bytes(e.text),
            "top_logprobs": [{"token": t.text, "logprob": t.logprob, "bytes": _bytes(t.text)} for t in e.top],
        }
        for e in entries
    ]


def chat_body(entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    return {"content": chat_content(entries), "refusal": None}


def completion_body(entries: Sequence[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """text_completion's choices[].logprobs. As vLLM's, each position's top_logprobs holds the
    chosen token besides its top alternatives; a prompt's first token has null for both."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []
    for e in entries:
        tokens.append(e.text)
        token_logprobs.append(e.logprob)
        if e.logprob is None:
            top_logprobs.append(None)
        else:
            top = {t.text: t.logprob for t in e.top}
            top.setdefault(e.text, e.logprob)
            top_logprobs.append(top)
        text_offset.append(offset)
        offset += len(e.text)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": text_offset,
    }
