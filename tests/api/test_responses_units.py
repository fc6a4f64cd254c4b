"""The Responses API's pure parts: its body's checks, items to chat messages and back, the chat
body it runs as, its stream events' order and numbering, prompt_cache_key's session."""

from __future__ import annotations

from typing import Any

import pytest

from api.responses.body import ResponsesBody
from api.responses.build import chat_body
from api.responses.events import ResponseEvents
from api.responses.items import chat_messages
from api.responses.record import ResponseRecord
from api.responses.render import skeleton
from api.responses.settle import apply
from api.schema.openai import parse_request
from api.schema.validation import validate
from broker.errors import InvalidRequestError
from broker.messages import GenerateResult, JobDone, TokenDelta, Usage
from broker.sessions.cache_key import session_of


def _body(**fields: Any) -> ResponsesBody:
    return validate(ResponsesBody, {"model": "m", "input": "hi", **fields})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("reasoning", {"effort": "low"}),
        ("truncation", "auto"),
        ("text", {"verbosity": "low"}),
        ("include", ["x"]),
    ],
)
def test_fields_kvferry_does_not_do_are_a_400_naming_them(field: str, value: Any) -> None:
    with pytest.raises(InvalidRequestError) as raised:
        _body(**{field: value})
    assert raised.value.param is not None and raised.value.param.startswith(field), raised.value


def test_items_fold_into_chat_messages() -> None:
    body = _body(
        input=[
            {"role": "user", "content": "weather?"},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "checking"}],
            },
            {"type": "function_call", "call_id": "c1", "name": "get", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "get", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        ]
    )
    messages = chat_messages(body.input)  # type: ignore[arg-type]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["content"] == "checking" and [c["id"] for c in messages[1]["tool_calls"]] == [
        "c1",
        "c2",
    ]
    assert messages[2] == {"role": "tool", "content": "sunny", "tool_call_id": "c1"}


def test_the_chat_body_carries_every_setting_under_its_chat_name() -> None:
    body = _body(
        instructions="be brief",
        max_output_tokens=5,
        tools=[{"type": "function", "name": "get", "parameters": {"type": "object"}}],
        tool_choice={"type": "function", "name": "get"},
        text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        include=["message.output_text.logprobs"],
        top_logprobs=2,
    )
    chat = chat_body(body, [{"role": "user", "content": "earlier"}], "resp_1")
    assert chat["messages"][0] == {"role": "system", "content": "be brief"} and len(chat["messages"]) == 3
    assert chat["session_id"] == "resp_1" and chat["max_completion_tokens"] == 5
    assert chat["tools"][0]["function"]["name"] == "get"
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get"}}
    assert chat["response_format"]["json_schema"]["schema"] == {"type": "object"}
    assert chat["logprobs"] is True and chat["top_logprobs"] == 2


def test_prompt_cache_key_is_the_chat_session() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "prompt_cache_key": "any key/with spaces",
    }
    request = parse_request("/v1/chat/completions", body)
    assert request.session_id == session_of("any key/with spaces") and request.session_id.startswith("pck.")
    both = parse_request("/v1/chat/completions", {**body, "session_id": "mine"})
    assert both.session_id == "mine"


def _done(text: str) -> JobDone:
    usage = Usage(prompt_tokens=10, completion_tokens=3, cached_tokens=4)
    result = GenerateResult("j", "m", text, (1, 2, 3), "stop", usage, "w1", 0.0, 0.0, 0.0)
    return JobDone(result=result)


def test_stream_events_are_numbered_in_order_and_close_what_they_opened() -> None:
    record = ResponseRecord(
        id="resp_abc", tenant="", job_id="j", body=skeleton(_body(), "resp_abc", "in_progress")
    )
    events = ResponseEvents(record)
    out = [*events.start()]
    out += events.delta(TokenDelta(text="Hel", token_ids=(1,)))
    out += events.delta(TokenDelta(text="lo", token_ids=(2,)))
    final = apply(record, _done("Hello!"))
    out += events.end(final, "Hello!", "stop")
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    assert [e["type"] for e in out] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",  # the result's tail past what was streamed
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert "".join(e["delta"] for e in out if e.get("delta")) == "Hello!"
    body = out[-1]["response"]
    assert (
        body["usage"]["input_tokens_details"]["cached_tokens"] == 4 and body["output"][0]["id"] == "msg_abc"
    )
    assert final.answer == {"role": "assistant", "content": "Hello!"}
