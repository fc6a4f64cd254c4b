"""One streamed chat turn against the stack's API, as the tiers workloads time it: TTFT (first
content token), per-token time after it (TPOT), the usage with its KV sources, and the worker."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass(slots=True)
class ChatTurn:
    text: str = ""
    ttft_s: float = float("nan")
    last_s: float = float("nan")
    usage: dict[str, Any] = field(default_factory=dict)
    worker: str = ""

    def row(self, sid: str, turn: int) -> dict[str, Any]:
        """The workloads' per-turn record."""
        done = self.usage.get("completion_tokens", 0)
        return {
            "sid": sid,
            "turn": turn,
            "ttft_s": self.ttft_s,
            "prompt": self.usage.get("prompt_tokens", 0),
            "cached": (self.usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
            "completion": done,
            # per output token after the first, as vLLM's bench serve counts TPOT
            "tpot_s": (self.last_s - self.ttft_s) / (done - 1) if done > 1 else float("nan"),
            "sources": self.usage.get("kv_sources", {}),
            "worker": self.worker,
        }


async def chat_turn(client: httpx.AsyncClient, body: dict[str, Any]) -> ChatTurn:
    """POST body (stream on, usage included) to /v1/chat/completions and time it."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    turn, text = ChatTurn(), []
    started = time.perf_counter()
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
                turn.last_s = time.perf_counter() - started
                if turn.ttft_s != turn.ttft_s:
                    turn.ttft_s = turn.last_s
                text.append(chunk["choices"][0]["delta"]["content"])
            turn.usage = chunk.get("usage") or turn.usage
            turn.worker = (chunk.get("x_kvferry") or {}).get("worker", turn.worker)
    turn.text = "".join(text)
    return turn
