"""A chat body's tools and tool_choice, checked, as what the job carries and the answer needs.

- `none` (the default without tools): the tools are not rendered and nothing is parsed, so the
  model cannot call one (vLLM's default too, without --expand-tools-even-if-tool-choice-none).
- `auto` (the default with tools): the tools are rendered, the output is free, and what it holds
  in the parser's call format comes back as tool_calls.
- `required`, or a named function: as auto, and the output is constrained by the parser's grammar
  (structured outputs, kind grammar) to one call (one or more when parallel_tool_calls) of an
  allowed function with arguments that follow its parameters schema, so that it always parses."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from api.schema.requests import ChatBody, Message
from api.schema.tools import NamedToolChoice
from api.tool_calls.parser import ToolParser
from api.tool_calls.registry import parser_for
from broker.errors import InvalidRequestError
from broker.messages import ChatMessage, ToolCall, ToolSpec
from broker.structured import StructuredOutputs

Mode = Literal["auto", "required", "named"]


@dataclass(frozen=True, slots=True)
class ToolCalling:
    mode: Mode
    parser: str  # a tool_call_parser name (api/tool_calls/parser.py)
    tools: tuple[ToolSpec, ...] = ()  # rendered into the prompt
    allowed: tuple[ToolSpec, ...] = ()  # what the grammar lets it call (required, named)
    parallel: bool = True

    @property
    def tool_parser(self) -> ToolParser:
        return parser_for(self.parser)

    def constraint(self) -> StructuredOutputs | None:
        """The grammar that forces a call (None for auto)."""
        if self.mode == "auto":
            return None
        grammar = self.tool_parser.grammar(self.allowed, self.parallel and self.mode == "required")
        spec = StructuredOutputs(grammar=grammar, source="tool_choice")
        spec.check()  # a parameters schema llguidance refuses: a 400 naming tool_choice
        return spec


def _spec(tool_index: int, name: str, description: str | None, parameters: object) -> ToolSpec:
    text = "" if parameters is None else json.dumps(parameters, ensure_ascii=False)
    if parameters is not None and not isinstance(parameters, dict):
        raise InvalidRequestError(f"tools[{tool_index}].function.parameters: not a JSON schema", "tools")
    return ToolSpec(name, description or "", text)


def tool_calling(b: ChatBody, parser: str) -> ToolCalling | None:
    """None when the model may not call a tool (no tools, or tool_choice none)."""
    choice = b.tool_choice
    if not b.tools:
        if choice is not None and choice != "none":
            raise InvalidRequestError("tool_choice needs tools", "tool_choice")
        return None
    if choice == "none":
        return None
    specs = tuple(
        _spec(i, t.function.name, t.function.description, t.function.parameters)
        for i, t in enumerate(b.tools)
    )
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise InvalidRequestError("tools: two functions have the same name", "tools")
    parallel = b.parallel_tool_calls is not False
    if isinstance(choice, NamedToolChoice):
        named = [s for s in specs if s.name == choice.function.name]
        if not named:
            raise InvalidRequestError(
                f"tool_choice names {choice.function.name!r}, which is not one of the tools", "tool_choice"
            )
        return ToolCalling("named", parser, specs, tuple(named), parallel=False)
    mode: Mode = "required" if choice == "required" else "auto"
    return ToolCalling(mode, parser, specs, specs if mode == "required" else (), parallel)


def chat_message(m: Message) -> ChatMessage:
    """A request's message as the job carries it (developer is system to a chat template)."""
    calls = tuple(ToolCall(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or ())
    role = "system" if m.role == "developer" else m.role
    return ChatMessage(role, m.text, tool_calls=calls, tool_call_id=m.tool_call_id)
