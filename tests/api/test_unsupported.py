"""Nothing silently ignored: a field kvferry does not implement is a 400 unsupported_parameter whose
param is the path to it, on every route that takes a completion body; the allow-listed no-op
fields are accepted; and a refused request leaves nothing in Redis."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from tests.api.conftest import MODEL, Served, request_keys
from tests.api.fake_worker import FakeWorker
from tests.api.test_errors import assert_error

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
MSGS = [{"role": "user", "content": "hi"}]

# What the api accepted and ignored before, less the allow-list (user, metadata, store: false,
# service_tier auto/default) and what is implemented now, with a value a client would send.
FORMERLY_IGNORED: dict[str, Any] = {
    "functions": [{"name": "f"}],
    "function_call": "auto",
    "modalities": ["text"],
    "audio": {"voice": "alloy", "format": "mp3"},
    "prediction": {"type": "content", "content": "x"},
    "reasoning_effort": "low",
    "web_search_options": {},
}
COMPLETIONS_ONLY: dict[str, Any] = {"suffix": "x"}


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": MSGS, **extra}


def text(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "hi", **extra}


def _refused(api: Served, rds: redis.Redis, path: str, body: dict[str, Any], param: str) -> str:
    """Refused on its own route and inside a /v1/jobs body alike; returns the message."""
    with api.client() as c:
        direct = c.post(path, json=body)
        queued = c.post("/v1/jobs", json={"endpoint": path, "body": body})
    error = assert_error(direct, 400, param, "unsupported_parameter")
    assert error["type"] == "invalid_request_error"
    assert_error(queued, 400, param, "unsupported_parameter")
    assert not (left := request_keys(rds)), left
    message: str = error["message"]
    return message


@pytest.mark.parametrize("field", sorted(FORMERLY_IGNORED))
def test_formerly_ignored_fields_are_refused(api: Served, rds: redis.Redis, field: str) -> None:
    message = _refused(api, rds, CHAT, chat(**{field: FORMERLY_IGNORED[field]}), field)
    assert field in message and "not supported by kvferry" in message
    _refused(api, rds, TEXT, text(**{field: FORMERLY_IGNORED[field]}), field)


@pytest.mark.parametrize("field", sorted(COMPLETIONS_ONLY))
def test_formerly_ignored_completion_fields_are_refused(api: Served, rds: redis.Redis, field: str) -> None:
    _refused(api, rds, TEXT, text(**{field: COMPLETIONS_ONLY[field]}), field)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (chat(messages=[{"role": "user", "content": "hi", "name": "bob"}]), "messages[0].name"),
        (
            chat(messages=[*MSGS, {"role": "assistant", "content": "x", "refusal": None}]),
            "messages[1].refusal",
        ),
        (
            chat(messages=[{"role": "user", "content": [{"type": "text", "text": "x", "y": 1}]}]),
            "messages[0].content[0].y",
        ),
        (
            chat(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True}),
            "stream_options.continuous_usage_stats",
        ),
        (chat(temprature=0.5), "temprature"),  # a typo is no longer a silent default
        (chat(**{"Not A-Field": 1}), "Not A-Field"),
    ],
    ids=["message name", "assistant refusal", "text part", "stream option", "typo", "odd key"],
)
def test_unknown_nested_fields_are_refused(
    api: Served, rds: redis.Redis, body: dict[str, Any], param: str
) -> None:
    _refused(api, rds, CHAT, body, param)


def test_a_long_unknown_key_is_named_in_part(api: Served, rds: redis.Redis) -> None:
    with api.client() as c:
        error = assert_error(c.post(CHAT, json=chat(**{"k" * 10_000: 1})), 400, code="unsupported_parameter")
    assert error["param"] == "k" * 64 + "…"


@pytest.mark.parametrize(
    ("field", "value"), [("store", True), ("service_tier", "flex"), ("service_tier", "priority")]
)
def test_allow_listed_fields_refuse_what_they_cannot_honour(
    api: Served, rds: redis.Redis, field: str, value: Any
) -> None:
    _refused(api, rds, CHAT, chat(**{field: value}), field)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (chat(user="u" * 257), "user"),
        (chat(metadata={str(i): "v" for i in range(17)}), "metadata"),
        (chat(metadata={"k" * 65: "v"}), "metadata"),
        (chat(metadata={"k": "v" * 513}), "metadata"),
        (chat(metadata={"k": 1}), "metadata"),
        (chat(store="false"), "store"),
        (chat(service_tier="gold"), "service_tier"),
    ],
    ids=["user", "metadata pairs", "metadata key", "metadata value", "metadata int", "store string", "tier"],
)
def test_allow_listed_fields_are_bounded(
    api: Served, rds: redis.Redis, body: dict[str, Any], param: str
) -> None:
    with api.client() as c:
        error = assert_error(c.post(CHAT, json=body), 400, param)
    assert error["code"] is None  # a bad value, not an unsupported field
    assert request_keys(rds) == []


def test_allow_listed_fields_are_accepted_and_change_nothing(api: Served, worker: FakeWorker) -> None:
    no_ops = {
        "user": "u" * 256,
        "metadata": {f"k{i}": "v" * 512 for i in range(16)},
        "store": False,
        "service_tier": "default",
    }
    with api.client() as c:
        for body in (chat(**no_ops), text(**no_ops), chat(service_tier="auto")):
            r = c.post(CHAT if "messages" in body else TEXT, json=body)
            assert r.status_code == 200, r.text
        plain = c.post(CHAT, json=chat())
        assert plain.status_code == 200
    seen = [s.job for s in worker.seen]
    assert seen[0].messages == seen[3].messages and seen[0].params == seen[3].params  # no trace


def test_unknown_job_envelope_fields_are_refused(api: Served, rds: redis.Redis) -> None:
    with api.client() as c:
        r = c.post("/v1/jobs", json={"endpoint": CHAT, "body": chat(), "deadline": 1})
    assert_error(r, 400, "deadline", "unsupported_parameter")  # a job's priority is in its body
    assert request_keys(rds) == []
