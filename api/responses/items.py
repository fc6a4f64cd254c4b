"""Responses items <-> chat messages. Input items become the chat body's messages (consecutive
function_call items fold into one assistant message's tool_calls, a function_call_output is a
tool message); an answer's text, parsed by the model's tool parser, becomes output items: a
`message` with its `output_text`, then one `function_call` per call. Item ids derive from the
response's id, so a stream replayed from the job's events names every item as the first did."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from api.responses.body import FunctionCallItem, FunctionCallOutputItem, InputItem, MessageItem
from api.schema.answer import logprobs as logprobs_body
from api.tool_calls.parser import ParsedCall, ToolParser, parse
from broker.messages import TokenLogprob

ChatDict = dict[str, Any]  # one message of a chat body (api/schema/requests.Message's shape)
LENGTH = "length"


def item_key(response_id: str) -> str:
    return response_id.removeprefix("resp_")


def message_id(response_id: str) -> str:
    return f"msg_{item_key(response_id)}"


def call_item_id(response_id: str, index: int) -> str:
    return f"fc_{item_key(response_id)}{index}"


def call_id_of(response_id: str, index: int) -> str:
    return f"call_{item_key(response_id)[:20]}{index}"


def chat_messages(items: str | Sequence[InputItem]) -> list[ChatDict]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[ChatDict] = []
    for item in items:
        if isinstance(item, MessageItem):
            out.append({"role": item.role, "content": item.text})
        elif isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and "tool_call_id" not in last:
                last.setdefault("tool_calls", []).append(call)
                if last["content"] == "":
                    last["content"] = None
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            out.append({"role": "tool", "content": item.output, "tool_call_id": item.call_id})
    return out


def input_item_bodies(items: str | Sequence[InputItem], response_id: str) -> list[dict[str, Any]]:
    """The input items as GET .../input_items lists them, each with an id."""
    if isinstance(items, str):
        items = [MessageItem(role="user", content=items)]
    out = []
    for i, item in enumerate(items):
        body = item.model_dump(by_alias=True, exclude_none=True)
        body.setdefault("type", "message")
        if isinstance(item, MessageItem) and isinstance(item.content, str):
            kind = "output_text" if item.role == "assistant" else "input_text"
            body["content"] = [{"type": kind, "text": item.content}]
        body["id"] = item.id or f"in_{item_key(response_id)}_{i}"
        out.append(body)
    return out


def text_part(text: str, logprobs: Sequence[TokenLogprob] | None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs_body.chat_content(logprobs)
    return part


def message_item(
    response_id: str, text: str, status: str, logprobs: Sequence[TokenLogprob] | None
) -> dict[str, Any]:
    return {
        "id": message_id(response_id),
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [text_part(text, logprobs)],
    }


def call_item(
    response_id: str, index: int, name: str, arguments: str, status: str = "completed"
) -> dict[str, Any]:
    return {
        "id": call_item_id(response_id, index),
        "type": "function_call",
        "call_id": call_id_of(response_id, index),
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def split(parser: ToolParser | None, text: str, finish_reason: str) -> tuple[str | None, list[ParsedCall]]:
    """(content, calls) of a whole answer."""
    if parser is None:
        return text, []
    return parse(parser, text, cut=finish_reason == LENGTH)


def output_items(
    response_id: str,
    parser: ToolParser | None,
    text: str,
    finish_reason: str,
    logprobs: Sequence[TokenLogprob] | None,
) -> tuple[list[dict[str, Any]], ChatDict]:
    """(the output items, the assistant message the conversation continues with). The message
    holds the answer's text exactly as generated when no call parsed out of it, so the next turn's
    prompt starts with the very tokens this turn ended with (workers/jobs/prompt.py)."""
    content, calls = split(parser, text, finish_reason)
    status = "incomplete" if finish_reason == LENGTH else "completed"
    items: list[dict[str, Any]] = []
    if content or not calls:
        items.append(message_item(response_id, content or "", status, logprobs))
    for i, call in enumerate(calls):
        items.append(call_item(response_id, i, call.name, call.arguments))
    if not calls:
        return items, {"role": "assistant", "content": text}
    tool_calls = [
        {
            "id": call_id_of(response_id, i),
            "type": "function",
            "function": {"name": c.name, "arguments": c.arguments},
        }
        for i, c in enumerate(calls)
    ]
    return items, {"role": "assistant", "content": content, "tool_calls": tool_calls}
