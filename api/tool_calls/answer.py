"""An answer's tool calls in OpenAI's shapes: a whole message's `tool_calls`, or a stream's
`delta.tool_calls` pieces (the id, type and name in a call's first piece, then its arguments)."""

from __future__ import annotations

from typing import Any

from api.tool_calls.parser import CallPiece, Piece, ToolParser, call_id, parse

TOOL_CALLS = "tool_calls"  # the finish_reason of an answer that called a tool
LENGTH = "length"  # cut by max_tokens: a call it left open is dropped, the finish_reason stays


def finish_reason_of(called: bool, finish_reason: str) -> str:
    return TOOL_CALLS if called and finish_reason != LENGTH else finish_reason


def message_body(parser: ToolParser | None, text: str, finish_reason: str) -> tuple[dict[str, Any], str]:
    """A chat choice's message and finish_reason (parser: None when no tool may be called)."""
    if parser is None:
        return {"role": "assistant", "content": text}, finish_reason
    content, calls = parse(parser, text, cut=finish_reason == LENGTH)
    if not calls:
        return {"role": "assistant", "content": content}, finish_reason
    tool_calls = [
        {"id": call_id(), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in calls
    ]
    message = {"role": "assistant", "content": content, "tool_calls": tool_calls}
    return message, finish_reason_of(True, finish_reason)


def call_delta(piece: CallPiece) -> dict[str, Any]:
    """One `delta.tool_calls` entry."""
    if piece.name is None:
        return {"index": piece.index, "function": {"arguments": piece.arguments}}
    function = {"name": piece.name, "arguments": piece.arguments}
    return {"index": piece.index, "id": call_id(), "type": "function", "function": function}


class StreamedCalls:
    """One streamed choice's output through its parser: content text and call deltas."""

    def __init__(self, parser: ToolParser) -> None:
        self._stream = parser.stream()
        self.called = False

    def feed(self, text: str) -> list[Piece]:
        return self._seen(self._stream.feed(text))

    def finish(self, finish_reason: str) -> list[Piece]:
        return self._seen(self._stream.finish(cut=finish_reason == LENGTH))

    def _seen(self, pieces: list[Piece]) -> list[Piece]:
        self.called = self.called or any(isinstance(p, CallPiece) for p in pieces)
        return pieces
