"""The tool-call parsers by name: what the `tool_call_parser` setting names."""

from __future__ import annotations

from api.tool_calls.hermes import HermesParser
from api.tool_calls.parser import ToolParser

PARSERS: dict[str, ToolParser] = {"hermes": HermesParser()}


def parser_for(name: str) -> ToolParser:
    if name not in PARSERS:
        raise ValueError(f"unknown tool_call_parser {name!r} (known: {', '.join(PARSERS)})")
    return PARSERS[name]
