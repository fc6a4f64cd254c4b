"""The tool-call parser interface, as vLLM's `--tool-call-parser`: one per model family's call
format, chosen by the `tool_call_parser` setting. A parser reads the output incrementally (so a
stream and a whole answer parse the same way) and writes the grammar that forces a call."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from broker.messages import ToolSpec


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True, slots=True)
class ContentPiece:
    """Output text outside any call: the message's content."""

    text: str


@dataclass(frozen=True, slots=True)
class CallPiece:
    """Part of call `index`: its first piece names the function, the others add to its arguments."""

    index: int
    name: str | None
    arguments: str


Piece = ContentPiece | CallPiece


class CallStream(Protocol):
    """Reads one choice's output. feed() and finish() return what can be told so far; `calls`
    holds each call once complete; `failed` is set when a call's text did not parse (as vLLM,
    a whole answer with one is all content). finish(cut=True) says the output was cut short
    (max_tokens): a call it left open and unparsable is dropped, not a failure."""

    calls: list[ParsedCall]
    failed: bool

    def feed(self, text: str) -> list[Piece]: ...

    def finish(self, cut: bool = False) -> list[Piece]: ...


class ToolParser(Protocol):
    name: str

    def stream(self) -> CallStream: ...

    def grammar(self, tools: Sequence[ToolSpec], parallel: bool) -> str:
        """A Lark grammar (llguidance's dialect) whose every sentence is one call (several when
        parallel) of one of `tools`, with arguments that follow its parameters schema."""
        ...


def call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def parse(parser: ToolParser, text: str, cut: bool = False) -> tuple[str | None, list[ParsedCall]]:
    """A whole output: (content, calls). No call, or one that does not parse: all of it is content;
    but a call left open by a cut (`cut`: max_tokens) is dropped and the complete ones stay."""
    stream = parser.stream()
    pieces = [*stream.feed(text), *stream.finish(cut)]
    if not stream.calls or stream.failed:
        return text, []
    content = "".join(p.text for p in pieces if isinstance(p, ContentPiece)).strip()
    return content or None, stream.calls
