"""The Hermes call format (vLLM's `hermes` parser), which Qwen2.5, Qwen3 and SmolLM2's chat
templates use: each call is `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.

Streamed, a call is announced (its name) once its JSON has reached `"arguments":`; its arguments
then go out as they come, less a trailing run of `}` and whitespace (one of those braces closes
the call's object, not the arguments) and less what may begin `</tool_call>`."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from api.tool_calls.parser import CallPiece, ContentPiece, ParsedCall, Piece
from broker.messages import ToolSpec
from broker.structured import JSON_OPTIONS

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]*)"\s*,\s*"arguments"\s*:\s*')
_HELD = "} \t\r\n"


def _partial(text: str, tag: str) -> int:
    """How many characters at the end of text could begin tag (held until the next piece)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def _arguments(body: str, doc: dict[str, object]) -> str:
    """The arguments as the model wrote them, when the body is name-first (what a stream sends);
    else as JSON text."""
    head = _HEAD.match(body)
    tail = body[head.end() :].rstrip() if head else ""
    if head and head.group(1) == doc["name"] and tail.endswith("}"):
        raw = tail[:-1].strip()
        try:
            if json.loads(raw) == doc["arguments"]:
                return raw
        except ValueError:
            pass
    args = doc["arguments"]
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


class HermesStream:
    def __init__(self) -> None:
        self.calls: list[ParsedCall] = []
        self.failed = False
        self._buf = ""  # outside a call: text not yet sent; inside: the call's body so far
        self._inside = False
        self._index = -1  # the last announced call's
        self._head_end = 0  # the current call's arguments start here in _buf; 0: not announced
        self._sent = ""  # the current call's arguments sent so far
        self._spaces = ""  # whitespace-only content, sent only if more content follows

    def feed(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        self._buf += text
        while True:
            if not self._inside:
                at = self._buf.find(OPEN)
                if at < 0:
                    keep = len(self._buf) - _partial(self._buf, OPEN)
                    self._content(self._buf[:keep], out)
                    self._buf = self._buf[keep:]
                    return out
                self._content(self._buf[:at], out)
                self._buf, self._inside = self._buf[at + len(OPEN) :], True
                self._head_end, self._sent = 0, ""
                continue
            at = self._buf.find(CLOSE)
            if at < 0:
                self._progress(out)
                return out
            body = self._buf[:at]
            self._buf, self._inside = self._buf[at + len(CLOSE) :], False
            self._end_call(body, OPEN + body + CLOSE, out)

    def finish(self, cut: bool = False) -> list[Piece]:
        """The output ended: a call left open parses if its JSON is whole (max_tokens, a stop);
        one that does not, cut short by max_tokens (`cut`), is dropped."""
        out: list[Piece] = []
        if self._inside:
            self._end_call(self._buf, OPEN + self._buf, out, open_cut=cut)
        else:
            self._content(self._buf, out)
        self._buf, self._inside = "", False
        return out

    def _content(self, text: str, out: list[Piece]) -> None:
        if not text:
            return
        # trailing whitespace waits for more content: the newline before or between calls is
        # no content of its own
        kept = text.rstrip()
        if kept:
            out.append(ContentPiece(self._spaces + kept))
            self._spaces = ""
        self._spaces += text[len(kept) :]

    def _progress(self, out: list[Piece]) -> None:
        if not self._head_end:
            head = _HEAD.match(self._buf)
            if head is None:
                return  # not name-first yet (or never): told whole at its end
            self._index += 1
            self._head_end = head.end()
            out.append(CallPiece(self._index, head.group(1), ""))
        args = self._buf[self._head_end :]
        args = args[: len(args) - _partial(args, CLOSE)].lstrip().rstrip(_HELD)
        if len(args) > len(self._sent) and args.startswith(self._sent):
            out.append(CallPiece(self._index, None, args[len(self._sent) :]))
            self._sent = args

    def _end_call(self, body: str, raw: str, out: list[Piece], open_cut: bool = False) -> None:
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        if not (isinstance(doc, dict) and isinstance(doc.get("name"), str) and "arguments" in doc):
            if open_cut:  # a call max_tokens cut mid-way: dropped, the complete ones stand
                self._head_end = 0
                return
            self.failed = True
            if not self._head_end:
                self._content(raw, out)  # as vLLM: what does not parse stays text
            return  # announced already: a stream cannot take it back
        call = ParsedCall(doc["name"], _arguments(body, doc))
        self.calls.append(call)
        if not self._head_end:
            self._index += 1
            out.append(CallPiece(self._index, call.name, call.arguments))
        elif call.arguments.startswith(self._sent) and len(call.arguments) > len(self._sent):
            out.append(CallPiece(self._index, None, call.arguments[len(self._sent) :]))
        self._head_end = 0


def _literal(text: str) -> str:
    return json.dumps(text)  # a Lark string literal: JSON's escapes are Lark's


def _schema(tool: ToolSpec) -> str:
    schema = json.loads(tool.parameters) if tool.parameters else {"type": "object"}
    # compact JSON, as response_format's: a small model can loop on free whitespace
    return json.dumps({**schema, "x-guidance": JSON_OPTIONS}, ensure_ascii=False)


class HermesParser:
    name = "hermes"

    def stream(self) -> HermesStream:
        return HermesStream()

    def grammar(self, tools: Sequence[ToolSpec], parallel: bool) -> str:
        rules = [
            'start: call ("\\n" call)*' if parallel else "start: call",
            f"call: {_literal(OPEN + chr(10))} body {_literal(chr(10) + CLOSE)}",
            "body: " + " | ".join(f"fn_{i}" for i in range(len(tools))),
        ]
        for i, tool in enumerate(tools):
            head = '{"name": ' + json.dumps(tool.name) + ', "arguments": '
            rules.append(f'fn_{i}: {_literal(head)} args_{i} "}}"')
            rules.append(f"args_{i}: %json{_schema(tool)}")
        return "\n".join(rules) + "\n"
