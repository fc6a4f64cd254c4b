"""Timed requests for the Responses bench: a streamed response's time to its first text delta, a
background submission's answer time, and a streamed chat completion with a fresh cache_salt (the
same history computed cold) for the recompute baseline."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True, slots=True)
class Turn:
    response_id: str
    text: str
    ttft_s: float
    worker: str
    cached_tokens: int
    input_tokens: int
    sent_at: float  # unix time the request left the client
    sources: dict[str, int]  # where the prompt's KV came from (usage.kv_sources)


def _sse(reply: httpx.Response) -> Any:
    for line in reply.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


def respond(http: httpx.Client, model: str, text: str, previous: str | None, tokens: int) -> Turn:
    body = {"model": model, "input": text, "max_output_tokens": tokens, "temperature": 0, "stream": True}
    if previous:
        body["previous_response_id"] = previous
    sent_at, start = time.time(), time.perf_counter()
    ttft = None
    with http.stream("POST", "/v1/responses", json=body) as reply:
        if reply.status_code != 200:
            raise RuntimeError(f"POST /v1/responses: {reply.status_code} {reply.read()[:300]!r}")
        for event in _sse(reply):
            if ttft is None and event["type"] == "response.output_text.delta":
                ttft = time.perf_counter() - start
            if event["type"] in ("response.completed", "response.incomplete", "response.failed"):
                final = event["response"]
    if final["status"] == "failed":
        raise RuntimeError(f"response failed: {final['error']}")
    usage = final["usage"]
    text = "".join(p["text"] for o in final["output"] if o["type"] == "message" for p in o["content"])
    return Turn(
        final["id"],
        text,
        ttft if ttft is not None else time.perf_counter() - start,
        final.get("worker", ""),
        usage["input_tokens_details"]["cached_tokens"],
        usage["input_tokens"],
        sent_at,
        usage.get("kv_sources", {}),
    )


def recompute_ttft(http: httpx.Client, model: str, messages: list[dict[str, str]]) -> float:
    """The same conversation as one chat request nothing can hit (a fresh cache_salt)."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": 2,
        "temperature": 0,
        "stream": True,
        "cache_salt": uuid.uuid4().hex,
    }
    start = time.perf_counter()
    with http.stream("POST", "/v1/chat/completions", json=body) as reply:
        for chunk in _sse(reply):
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                return time.perf_counter() - start
    return time.perf_counter() - start


def background_submit_s(http: httpx.Client, model: str, text: str) -> tuple[float, str]:
    body = {"model": model, "input": text, "max_output_tokens": 4, "background": True}
    start = time.perf_counter()
    reply = http.post("/v1/responses", json=body)
    took = time.perf_counter() - start
    if reply.status_code != 200:
        raise RuntimeError(f"background POST: {reply.status_code} {reply.text[:300]}")
    return took, str(reply.json()["id"])
