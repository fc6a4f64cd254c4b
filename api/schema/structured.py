"""A request's structured-output fields (response_format, structured_outputs, or vLLM's older
guided_json / guided_regex / guided_choice / guided_grammar) as one StructuredOutputs, checked
here by llguidance's own validator (no tokenizer, no torch), so that a bad schema, regex or
grammar is a 400 naming its field before anything is queued."""

from __future__ import annotations

import json
from typing import Any

from api.schema.structured_fields import JsonSchema, StructuredFields, StructuredOutputsBody
from broker.errors import InvalidRequestError
from broker.structured import StructuredOutputs

FIELDS = (
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
)


def _schema_text(schema: JsonSchema | str, param: str) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            raise InvalidRequestError(f"{param}: the JSON schema is not valid JSON", param) from None
    if not isinstance(schema, dict):
        raise InvalidRequestError(f"{param}: the JSON schema must be a JSON object", param)
    # key order kept: it is the order the properties are generated in
    return json.dumps(schema, ensure_ascii=False, separators=(",", ":"))


def _from_response_format(b: StructuredFields) -> StructuredOutputs | None:
    rf = b.response_format
    if rf is None or rf.type == "text":
        return None
    if rf.type == "json_object":
        return StructuredOutputs(json_object=True, source="response_format")
    if rf.json_schema is None:
        raise InvalidRequestError(
            "response_format.json_schema is required when type is json_schema", "response_format"
        )
    return StructuredOutputs(
        json=_schema_text(rf.json_schema.schema_, "response_format"), source="response_format"
    )


def _from_structured_outputs(so: StructuredOutputsBody) -> StructuredOutputs:
    return StructuredOutputs(
        json=None if so.json_ is None else _schema_text(so.json_, "structured_outputs"),
        json_object=bool(so.json_object),
        regex=so.regex,
        choice=None if so.choice is None else tuple(so.choice),
        grammar=so.grammar,
        source="structured_outputs",
    )


def _build(b: StructuredFields, field: str) -> StructuredOutputs | None:
    if field == "response_format":
        return _from_response_format(b)
    if field == "structured_outputs":
        assert b.structured_outputs is not None
        return _from_structured_outputs(b.structured_outputs)
    value: Any = getattr(b, field)
    if field == "guided_json":
        return StructuredOutputs(json=_schema_text(value, field), source=field)
    if field == "guided_choice":
        return StructuredOutputs(choice=tuple(value), source=field)
    if field == "guided_regex":
        return StructuredOutputs(regex=value, source=field)
    return StructuredOutputs(grammar=value, source=field)


def structured_outputs(b: StructuredFields) -> StructuredOutputs | None:
    """The body's output constraint, validated (None if it has none). Raises InvalidRequestError
    naming the field: two fields given, a spec that is not one, or one llguidance refuses."""
    given = [
        f
        for f in FIELDS
        if getattr(b, f) is not None and not (f == "response_format" and b.response_format.type == "text")  # type: ignore[union-attr]
    ]
    if not given:
        return None
    if len(given) > 1:
        raise InvalidRequestError(f"give at most one of {', '.join(given)}", given[1])
    spec = _build(b, given[0])
    if spec is not None:
        spec.check()
    return spec
