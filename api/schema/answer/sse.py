"""OpenAI streaming: chunk bodies for chat and text completions, framed as server-sent events."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from api.schema.answer import logprobs as logprobs_body
from api.schema.answer.bodies import usage_body
from api.schema.openai import CompletionRequest
from broker.messages import TokenLogprob, Usage

DONE = b"data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def frame(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


class ChunkWriter:
    """Builds one response's chunks: the first chat chunk carries the role, the last one the
    finish_reason; with include_usage every chunk has "usage": null and a final one the usage."""

    def __init__(self, request: CompletionRequest, response_id: str, created: int, index: int = 0) -> None:
        self.request = request
        self.index = index  # the choice's, when several jobs answer one request
        self.response_id = response_id
        self.created = created
        self._role_sent = False
        self._offset = 0  # completions' text_offset of the next token

    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": self.response_id,
            "object": "chat.completion.chunk" if self.request.is_chat else "text_completion",
            "created": self.created,
            "model": self.request.model,
            "choices": choices,
        }
        if self.request.include_usage:
            chunk["usage"] = None
        return chunk

    def text(
        self,
        text: str,
        finish_reason: str | None = None,
        worker: str | None = None,
        logprobs: Sequence[TokenLogprob] = (),
    ) -> bytes:
        """A text chunk, with its tokens' logprobs when the request asked; the last one (with
        finish_reason) also names the worker, as an extension field `x_kvferry` that OpenAI
        clients ignore."""
        if not self.request.is_chat:
            lp = self._completion_logprobs(logprobs) if self.request.wants_logprobs else None
            choice = {"index": self.index, "text": text, "logprobs": lp, "finish_reason": finish_reason}
            return frame(self._with_worker(self._chunk([choice]), worker))
        delta: dict[str, Any] = {}
        if not self._role_sent:
            delta["role"] = "assistant"
            self._role_sent = True
        if text or finish_reason is None:
            delta["content"] = text
        chat_lp = logprobs_body.chat_body(logprobs) if self.request.wants_logprobs and logprobs else None
        choice = {"index": self.index, "delta": delta, "logprobs": chat_lp, "finish_reason": finish_reason}
        return frame(self._with_worker(self._chunk([choice]), worker))

    def tool_calls(self, calls: list[dict[str, Any]], logprobs: Sequence[TokenLogprob] = ()) -> bytes:
        """A chat chunk of `delta.tool_calls` entries (api/tool_calls/answer.py's call_delta)."""
        delta: dict[str, Any] = {}
        if not self._role_sent:
            delta["role"] = "assistant"
            self._role_sent = True
        delta["tool_calls"] = calls
        chat_lp = logprobs_body.chat_body(logprobs) if self.request.wants_logprobs and logprobs else None
        choice = {"index": self.index, "delta": delta, "logprobs": chat_lp, "finish_reason": None}
        return frame(self._chunk([choice]))

    def echo(self, prompt_text: str, prompt_logprobs: Sequence[TokenLogprob]) -> bytes:
        """Completions' echo: the prompt (and its logprobs) as the stream's first chunk."""
        return self.text(prompt_text, logprobs=prompt_logprobs)

    def _completion_logprobs(self, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
        body = logprobs_body.completion_body(entries, self._offset)
        self._offset += sum(len(e.text) for e in entries)
        return body

    @staticmethod
    def _with_worker(chunk: dict[str, Any], worker: str | None) -> dict[str, Any]:
        if worker is not None:
            chunk["x_kvferry"] = {"worker": worker}
        return chunk

    def usage(self, usage: Usage) -> bytes:
        chunk = self._chunk([])
        chunk["usage"] = usage_body(usage)
        return frame(chunk)


def error_frame(body: dict[str, Any]) -> bytes:
    """A failure after the stream began: OpenAI clients raise on a chunk with an "error" key."""
    return frame(body)
