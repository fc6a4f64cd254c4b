"""Tool calling through real parts: the openai client and langchain-openai -> api -> queue -> a
`kvferry worker` on the tiny random model. Its text is nonsense, but tool_choice required is
enforced by a grammar, so the calls always parse; a tool turn (an assistant's content null with
tool_calls, then a tool message) is accepted and rendered; the agent loop runs end to end."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jsonschema
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI
from openai import OpenAI

from tests.integration.conftest import MODEL, WorkerProcess

PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOL: Any = {
    "type": "function",
    "function": {"name": "get_weather", "description": "The weather in a city", "parameters": PARAMETERS},
}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_required_calls_parse_whole_and_streamed(
    api_url: str, worker_factory: Callable[..., WorkerProcess]
) -> None:
    worker_factory("tools")
    client = OpenAI(base_url=f"{api_url}/v1", api_key="unused", max_retries=0, timeout=120)
    # one call: a random model allowed several may write calls until max_tokens cuts one
    reply = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=1.0,
        max_tokens=200,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls or []
    assert len(calls) == 1 and calls[0].id.startswith("call_")
    for call in calls:
        assert call.type == "function" and call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), PARAMETERS)

    stream = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=[TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=1.0,
        max_tokens=200,
        stream=True,
    )
    arguments, names, finish = "", [], None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        assert not (delta.content or "").count("<tool_call>")
        for entry in delta.tool_calls or ():
            assert entry.index == 0  # a named choice: exactly one call
            if entry.function and entry.function.name:
                names.append(entry.function.name)
            arguments += (entry.function.arguments or "") if entry.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert names == ["get_weather"] and finish == "tool_calls"
    jsonschema.validate(json.loads(arguments), PARAMETERS)

    # the tool turn goes back: an assistant's content null with its calls, then the tool's answer
    turn: Any = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls[:1]]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": "sunny, 21C"},
    ]
    final = client.chat.completions.create(model=MODEL, messages=turn, tools=[TOOL], max_tokens=10)
    assert final.choices[0].finish_reason in ("stop", "length", "tool_calls")
    plain = client.chat.completions.create(model=MODEL, messages=turn, max_tokens=10)  # tools gone: none
    assert plain.choices[0].message.tool_calls is None


def test_langchain_agent_loop(api_url: str, worker_factory: Callable[..., WorkerProcess]) -> None:
    worker_factory("agent")
    llm = ChatOpenAI(
        base_url=f"{api_url}/v1",
        api_key="x",
        model=MODEL,
        temperature=1.0,
        max_tokens=200,
        max_retries=0,
        timeout=120,
    )
    question = HumanMessage("What is the weather in Paris?")
    called = llm.bind_tools([TOOL], tool_choice="required", parallel_tool_calls=False).invoke([question])
    assert called.tool_calls, called
    call = called.tool_calls[0]
    assert call["name"] == "get_weather"
    jsonschema.validate(call["args"], PARAMETERS)
    answer = ToolMessage(content=f"sunny in {call['args']['city']}", tool_call_id=call["id"])
    final = llm.bind(max_tokens=10).invoke([question, called, answer])
    assert isinstance(final.content, str) and not final.tool_calls
