"""Structured-output fields at the edge: each form reaches the worker as one StructuredOutputs
naming its field; a bad schema, regex, choice or grammar is a 400 naming the field, on both
endpoints and /v1/jobs, with nothing written to Redis; checking a spec loads no torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from broker.structured import StructuredOutputs
from tests.api.conftest import MODEL, Served, request_keys
from tests.api.fake_worker import FakeWorker
from tests.api.test_errors import assert_error

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
SCHEMA = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}
SCHEMA_TEXT = '{"type":"object","properties":{"b":{"type":"integer"},"a":{"type":"string"}}}'  # order kept
ROOT = Path(__file__).resolve().parents[2]


def body(path: str, **extra: Any) -> dict[str, Any]:
    if path == CHAT:
        return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}
    return {"model": MODEL, "prompt": "hi", **extra}


def json_schema(schema: Any, **extra: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "thing", "schema": schema, **extra}}


ACCEPTED: list[tuple[str, dict[str, Any], StructuredOutputs | None]] = [
    ("text", {"response_format": {"type": "text"}}, None),
    (
        "json_object",
        {"response_format": {"type": "json_object"}},
        StructuredOutputs(json_object=True, source="response_format"),
    ),
    (
        "json_schema",
        {"response_format": json_schema(SCHEMA, strict=True)},
        StructuredOutputs(json=SCHEMA_TEXT, source="response_format"),
    ),
    ("structured json", {"structured_outputs": {"json": SCHEMA}}, StructuredOutputs(json=SCHEMA_TEXT)),
    ("structured regex", {"structured_outputs": {"regex": "[0-9]+"}}, StructuredOutputs(regex="[0-9]+")),
    (
        "structured choice",
        {"structured_outputs": {"choice": ["y", "n"]}},
        StructuredOutputs(choice=("y", "n")),
    ),
    (
        "structured lark",
        {"structured_outputs": {"grammar": 'start: "a"+'}},
        StructuredOutputs(grammar='start: "a"+'),
    ),
    (
        "guided_json text",
        {"guided_json": json.dumps(SCHEMA)},
        StructuredOutputs(json=SCHEMA_TEXT, source="guided_json"),
    ),
    ("guided_regex", {"guided_regex": "x|y"}, StructuredOutputs(regex="x|y", source="guided_regex")),
    (
        "guided_choice",
        {"guided_choice": ["a", "b"]},
        StructuredOutputs(choice=("a", "b"), source="guided_choice"),
    ),
    (
        "guided_grammar gbnf",
        {"guided_grammar": 'root ::= "x"'},
        StructuredOutputs(grammar='root ::= "x"', source="guided_grammar"),
    ),
]

REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("unknown type", {"response_format": {"type": "xml"}}, "response_format"),
    ("json_schema missing", {"response_format": {"type": "json_schema"}}, "response_format"),
    (
        "schema missing",
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        "response_format",
    ),
    ("bad name", {"response_format": json_schema({}, name="has space")}, "response_format"),
    ("bad schema type", {"response_format": json_schema({"type": "foo"})}, "response_format"),
    (
        "negative maxLength",
        {"response_format": json_schema({"type": "string", "maxLength": -1})},
        "response_format",
    ),
    ("dangling $ref", {"guided_json": {"$ref": "#/nowhere"}}, "guided_json"),
    ("schema not JSON", {"guided_json": "{nope"}, "guided_json"),
    ("schema a list", {"guided_json": "[1]"}, "guided_json"),
    ("bad regex", {"guided_regex": "a{3"}, "guided_regex"),
    ("empty regex", {"guided_regex": ""}, "guided_regex"),
    ("empty choice", {"guided_choice": []}, "guided_choice"),
    ("bad lark", {"guided_grammar": "start: nowhere"}, "guided_grammar"),
    ("bad gbnf", {"guided_grammar": "root ::= ::="}, "guided_grammar"),
    (
        "two in structured_outputs",
        {"structured_outputs": {"regex": "a", "choice": ["b"]}},
        "structured_outputs",
    ),
    ("none in structured_outputs", {"structured_outputs": {}}, "structured_outputs"),
    ("bad regex in structured_outputs", {"structured_outputs": {"regex": "("}}, "structured_outputs"),
    ("two fields", {"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex"),
]


@pytest.mark.parametrize("path", [CHAT, TEXT])
def test_every_form_reaches_the_worker(api: Served, worker: FakeWorker, path: str) -> None:
    with api.client() as c:
        for name, fields, _ in ACCEPTED:
            r = c.post(path, json=body(path, **fields))
            assert r.status_code == 200, (name, r.text)
        streamed = c.post(path, json=body(path, stream=True, response_format=json_schema(SCHEMA)))
        assert streamed.status_code == 200 and "data: [DONE]" in streamed.text
    specs = [s.job.params.structured_outputs for s in worker.seen]
    assert specs[:-1] == [want for _, _, want in ACCEPTED]
    assert specs[-1] == StructuredOutputs(json=SCHEMA_TEXT, source="response_format")


@pytest.mark.parametrize(("fields", "param"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_bad_specs_are_400_naming_the_field(
    api: Served, rds: redis.Redis, fields: dict[str, Any], param: str
) -> None:
    with api.client() as c:
        for path in (CHAT, TEXT):
            error = assert_error(c.post(path, json=body(path, **fields)), 400, param)
            assert error["type"] == "invalid_request_error"
        assert_error(c.post("/v1/jobs", json={"endpoint": CHAT, "body": body(CHAT, **fields)}), 400, param)
    assert not (left := request_keys(rds)), left


_CHECK = r"""
import json, sys
from api.schema.openai import parse_request
specs = {"guided_json": {"type": "object"}}, {"guided_regex": "[a-z]+"}, {"guided_grammar": 'root ::= "x"'}
for fields in specs:
    parse_request("/v1/completions", {"model": "m", "prompt": "hi", **fields})
print(json.dumps([m for m in ("torch", "transformers") if m in sys.modules]))
"""


def test_checking_a_spec_loads_no_torch() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHECK], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
