"""The tool-calling parts of a chat body, as OpenAI's: `tools`, `tool_choice`, and the message
fields of a tool turn (an assistant's `tool_calls`, a tool message's `tool_call_id`). Bounded like
every other field; api/tool_calls/ turns them into what the job carries and the parser needs."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from api.schema.strict import Strict as _Strict

MAX_TOOLS = 128
MAX_TOOL_CALLS = 128  # calls in one assistant message
MAX_DESCRIPTION_CHARS = 1 << 14
MAX_ARGUMENTS_CHARS = 1 << 16
# OpenAI's rule for a function's name; it also keeps a name safe inside the required grammar
FunctionName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
CallId = Annotated[str, Field(min_length=1, max_length=256)]


class FunctionDef(_Strict):
    name: FunctionName
    description: Annotated[str, Field(max_length=MAX_DESCRIPTION_CHARS)] | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; None: no arguments
    strict: bool | None = None  # accepted: with tool_choice required the arguments always follow it


class ToolDef(_Strict):
    type: Literal["function"]
    function: FunctionDef


class FunctionRef(_Strict):
    name: FunctionName


class NamedToolChoice(_Strict):
    """tool_choice naming one function: the model calls exactly it."""

    type: Literal["function"]
    function: FunctionRef


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice
Tools = Annotated[list[ToolDef], Field(min_length=1, max_length=MAX_TOOLS)]


class FunctionCall(_Strict):
    name: FunctionName
    arguments: Annotated[str, Field(max_length=MAX_ARGUMENTS_CHARS)]  # JSON text, as OpenAI sends it


class ToolCallBody(_Strict):
    """One of an assistant message's tool_calls."""

    id: CallId
    type: Literal["function"]
    function: FunctionCall


ToolCalls = Annotated[list[ToolCallBody], Field(min_length=1, max_length=MAX_TOOL_CALLS)]
