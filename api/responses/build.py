"""A Responses body as the chat completion job it runs as: the instructions as a system message,
the conversation so far (a previous response's or a conversation's) and the new input as chat
messages, the settings under their chat names; then validated and checked by the chat path
itself (api/intake.parse), so tools, tool_choice and structured outputs mean what they mean there."""

from __future__ import annotations

from typing import Any

from api.responses.body import NamedFunction, ResponsesBody, TextFormat
from api.responses.items import ChatDict, chat_messages


def _response_format(f: TextFormat) -> dict[str, Any]:
    if f.type != "json_schema":
        return {"type": f.type}
    schema: dict[str, Any] = {"name": f.name or "response", "schema": f.schema_ or {}}
    if f.description is not None:
        schema["description"] = f.description
    if f.strict is not None:
        schema["strict"] = f.strict
    return {"type": "json_schema", "json_schema": schema}


def chat_body(body: ResponsesBody, history: list[ChatDict], session_id: str | None) -> dict[str, Any]:
    messages = [{"role": "system", "content": body.instructions}] if body.instructions is not None else []
    chat: dict[str, Any] = {
        "model": body.model,
        "messages": [*messages, *history, *chat_messages(body.input)],
    }
    optional = {
        "session_id": session_id,
        "max_completion_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "parallel_tool_calls": body.parallel_tool_calls,
    }
    chat.update({k: v for k, v in optional.items() if v is not None})
    if body.tools:
        chat["tools"] = [
            {"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type"})}
            for t in body.tools
        ]
    choice = body.tool_choice
    if isinstance(choice, NamedFunction):
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice is not None:
        chat["tool_choice"] = choice
    if body.text is not None and body.text.format is not None:
        chat["response_format"] = _response_format(body.text.format)
    if body.wants_logprobs:
        chat["logprobs"] = True
        chat["top_logprobs"] = body.top_logprobs or 0
    return chat
