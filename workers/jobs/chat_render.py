"""A chat job's messages and tools as the model's chat template takes them.

A template that knows tools (it names `tools`, as Qwen2.5's and Qwen3's do) gets OpenAI's shapes:
`tools=[{type: function, function: {...}}]`, an assistant's `tool_calls` with `arguments` as a dict
(Qwen's templates write it with `| tojson`: a string would come out quoted twice) and `tool`
messages with their `tool_call_id`. A template that does not (SmolLM2-135M's only knows role and
content) gets the Hermes format spelled out as text, as Qwen2.5's template writes it: the tools in
the system message, each call as `<tool_call>` JSON in the assistant's content, each result as a
user turn in `<tool_response>`; what api/tool_calls/hermes.py parses back."""

from __future__ import annotations

import json
from typing import Any

from broker.messages import ChatMessage, GenerateJob, ToolCall, ToolSpec

_HERMES_SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_HERMES_HOW = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def knows_tools(tokenizer: Any) -> bool:
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "tools" in template


def tool_body(tool: ToolSpec) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    if tool.description:
        function["description"] = tool.description
    function["parameters"] = json.loads(tool.parameters) if tool.parameters else {"type": "object"}
    return {"type": "function", "function": function}


def _arguments(call: ToolCall) -> Any:
    try:
        return json.loads(call.arguments)
    except ValueError:  # the client's own text: keep it as it came
        return call.arguments


def _native(m: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _arguments(c)}}
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


def _call_text(call: ToolCall) -> str:
    body = json.dumps({"name": call.name, "arguments": _arguments(call)}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def _spelled(m: ChatMessage) -> dict[str, str]:
    if m.role == "tool":
        return {"role": "user", "content": f"<tool_response>\n{m.content}\n</tool_response>"}
    if m.tool_calls:
        parts = ([m.content] if m.content else []) + [_call_text(c) for c in m.tool_calls]
        return {"role": m.role, "content": "\n".join(parts)}
    return {"role": m.role, "content": m.content}


def _with_tools_system(messages: list[dict[str, Any]], tools: tuple[ToolSpec, ...]) -> list[dict[str, Any]]:
    listing = "".join("\n" + json.dumps(tool_body(t), ensure_ascii=False) for t in tools)
    text = _HERMES_SYSTEM + listing + _HERMES_HOW
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": messages[0]["content"] + "\n\n" + text}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def template_inputs(job: GenerateJob, tokenizer: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(messages, extra keyword arguments of apply_chat_template) for a chat job."""
    uses_tools = bool(job.tools) or any(m.tool_calls or m.tool_call_id is not None for m in job.messages)
    if not uses_tools:
        return [{"role": m.role, "content": m.content} for m in job.messages], {}
    if knows_tools(tokenizer):
        extra = {"tools": [tool_body(t) for t in job.tools]} if job.tools else {}
        return [_native(m) for m in job.messages], extra
    messages: list[dict[str, Any]] = [_spelled(m) for m in job.messages]
    return (_with_tools_system(messages, job.tools) if job.tools else messages), {}
