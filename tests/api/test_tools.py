"""Tool calling at the edge: tools, tool_choice and tool-turn messages are checked (a 400 naming
the field), reach the worker typed, and the model's Hermes calls come back as OpenAI's
tool_calls, whole or streamed as deltas, never as raw markup."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from broker.messages import ChatMessage, ToolCall, ToolSpec
from tests.api.conftest import MODEL, Served, request_keys
from tests.api.fake_worker import FakeWorker
from tests.api.test_errors import assert_error
from tests.api.test_jobs import FINAL, wait_for

CHAT = "/v1/chat/completions"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}
TOOLS = [WEATHER, TIME]
CALLED = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
        }
    ],
}
ANSWERED = {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}


def chat(content: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("choice without tools", chat(tool_choice="required"), "tool_choice"),
    (
        "unknown name",
        chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
        "tool_choice",
    ),
    ("bad choice", chat(tools=TOOLS, tool_choice="always"), "tool_choice"),
    (
        "required and response_format",
        chat(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}),
        "tool_choice",
    ),
    ("same name twice", chat(tools=[TIME, TIME]), "tools"),
    ("bad name", chat(tools=[{"type": "function", "function": {"name": "has space"}}]), "tools"),
    ("empty tools", chat(tools=[]), "tools"),
    ("no function", chat(tools=[{"type": "function"}]), "tools"),
    (
        "bad parameters schema",
        chat(
            tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "foo"}}}],
            tool_choice="required",
        ),
        "tool_choice",
    ),
    (
        "tool message without its call id",
        {"model": MODEL, "messages": [{"role": "tool", "content": "x"}]},
        "messages",
    ),
    (
        "tool_calls on a user message",
        {"model": MODEL, "messages": [{**CALLED, "role": "user"}]},
        "messages",
    ),
    (
        "content null without calls",
        {"model": MODEL, "messages": [{"role": "user", "content": None}]},
        "messages",
    ),
    ("parallel not a bool", chat(tools=TOOLS, parallel_tool_calls="yes"), "parallel_tool_calls"),
]


@pytest.mark.parametrize(("body", "param"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_bad_tool_fields_are_400(api: Served, rds: redis.Redis, body: dict[str, Any], param: str) -> None:
    with api.client() as c:
        assert_error(c.post(CHAT, json=body), 400, param)
        assert_error(c.post("/v1/jobs", json={"endpoint": CHAT, "body": body}), 400, param)
    assert not (left := request_keys(rds)), left


def test_tools_and_tool_turns_reach_the_worker_typed(api: Served, worker: FakeWorker) -> None:
    turns = [{"role": "user", "content": "weather?"}, CALLED, ANSWERED]
    with api.client() as c:
        for choice in ("auto", "required", {"type": "function", "function": {"name": "get_time"}}, "none"):
            r = c.post(CHAT, json={"model": MODEL, "messages": turns, "tools": TOOLS, "tool_choice": choice})
            assert r.status_code == 200, r.text
    auto, required, named, none = (s.job for s in worker.seen)
    assert auto.messages == (
        ChatMessage("user", "weather?"),
        ChatMessage("assistant", "", tool_calls=(ToolCall("call_1", "get_weather", '{"city": "Oslo"}'),)),
        ChatMessage("tool", "sunny", tool_call_id="call_1"),
    )
    params = json.dumps(WEATHER["function"]["parameters"])  # type: ignore[index]
    assert auto.tools == (ToolSpec("get_weather", "The weather in a city", params), ToolSpec("get_time"))
    assert auto.params.structured_outputs is None
    assert none.tools == () and none.params.structured_outputs is None  # not rendered, not callable
    for job, names in ((required, ("get_weather", "get_time")), (named, ("get_time",))):
        spec = job.params.structured_outputs
        assert spec is not None and spec.source == "tool_choice" and spec.grammar is not None
        assert "<tool_call>" in spec.grammar
        assert all(f'\\"{n}\\"' in spec.grammar for n in names)
    assert '\\"get_weather\\"' not in named.params.structured_outputs.grammar  # type: ignore[union-attr,operator]
    assert named.tools == auto.tools  # all are rendered; the grammar allows the named one


def test_calls_come_back_as_tool_calls(api: Served, worker: FakeWorker) -> None:
    with api.client() as c:
        r = c.post(CHAT, json=chat("TOOL_CALL", tools=TOOLS))
        plain = c.post(CHAT, json=chat("TOOL_CALL"))  # no tools: the text as it came
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] == "Checking."
    calls = message["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)
    assert len({c["id"] for c in calls}) == 2
    assert "<tool_call>" in plain.json()["choices"][0]["message"]["content"]
    assert plain.json()["choices"][0]["finish_reason"] == "stop"


def _chunks(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def test_streamed_calls_are_deltas(api: Served, worker: FakeWorker) -> None:
    with api.client() as c:
        r = c.post(CHAT, json=chat("TOOL_CALL", tools=TOOLS, stream=True))
    assert r.status_code == 200
    deltas = [ch["choices"][0]["delta"] for ch in _chunks(r.text) if ch["choices"]]
    assert deltas[0]["role"] == "assistant"
    content = "".join(d.get("content") or "" for d in deltas)
    assert content == "Checking."
    calls: dict[int, dict[str, str]] = {}
    for d in deltas:
        for entry in d.get("tool_calls", ()):
            if "id" in entry:  # a call's first delta: id, type and name
                assert entry["index"] not in calls and entry["type"] == "function"
                calls[entry["index"]] = {
                    "name": entry["function"]["name"],
                    "arguments": "",
                    "id": entry["id"],
                }
            calls[entry["index"]]["arguments"] += entry["function"]["arguments"]
    assert [calls[i]["name"] for i in sorted(calls)] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}
    assert json.loads(calls[1]["arguments"]) == {}
    pieces = sum(1 for d in deltas for e in d.get("tool_calls", ()) if e["index"] == 0)
    assert pieces > 2  # the arguments came in pieces, as they were generated
    assert _chunks(r.text)[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_length_cut_keeps_the_complete_calls(api: Served, worker: FakeWorker) -> None:
    body = chat("TOOL_CUT", tools=TOOLS, tool_choice="required", max_tokens=30)
    with api.client() as c:
        whole = c.post(CHAT, json=body).json()["choices"][0]
        streamed = c.post(CHAT, json={**body, "stream": True})
    assert whole["finish_reason"] == "length"
    assert whole["message"]["content"] is None  # no raw markup
    calls = whole["message"]["tool_calls"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    chunks = _chunks(streamed.text)
    deltas = [ch["choices"][0]["delta"] for ch in chunks if ch["choices"]]
    assert not "".join(d.get("content") or "" for d in deltas)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_queued_job_result_parses_calls(api: Served, worker: FakeWorker) -> None:
    with api.client() as c:
        job = c.post("/v1/jobs", json={"endpoint": CHAT, "body": chat("TOOL_CALL", tools=TOOLS)}).json()
        view = wait_for(c, job["id"], FINAL)
    assert view["result"]["choices"][0]["finish_reason"] == "tool_calls", view
    assert view["result"]["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
