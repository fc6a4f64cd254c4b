"""JSON schemas with bounded outputs (maxLength, maxItems, enums, integer ranges, no additional
properties), each with one instance that satisfies it: what the grammar-engine benchmark compiles
and traces, and what the structured-output tests sample against (a model sampling at temperature
1 cannot run any of them past a few dozen tokens)."""

from __future__ import annotations

from typing import Any

_CLOSED = {"additionalProperties": False}


def _obj(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, **_CLOSED}


_INT = {"type": "integer", "minimum": 0, "maximum": 120}
_POINT = _obj(
    {
        "x": {"type": "integer", "minimum": -9, "maximum": 9},
        "y": {"type": "integer", "minimum": -9, "maximum": 9},
    },
    ["x", "y"],
)

# (name, schema, an instance it accepts)
SCHEMAS: list[tuple[str, dict[str, Any], Any]] = [
    (
        "person",
        _obj({"name": {"type": "string", "maxLength": 12}, "age": _INT}, ["name", "age"]),
        {"name": "Ada Lovelace", "age": 36},
    ),
    ("enum", _obj({"color": {"enum": ["red", "green", "blue"]}}, ["color"]), {"color": "green"}),
    (
        "int_array",
        _obj({"scores": {"type": "array", "items": _INT, "maxItems": 5}}, ["scores"]),
        {"scores": [3, 99, 42]},
    ),
    (
        "nullable",
        _obj(
            {"ok": {"type": "boolean"}, "note": {"type": ["string", "null"], "maxLength": 8}}, ["ok", "note"]
        ),
        {"ok": True, "note": None},
    ),
    (
        "nested",
        _obj(
            {
                "user": _obj(
                    {
                        "id": {"type": "integer", "minimum": 1, "maximum": 9999},
                        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
                    },
                    ["id", "tags"],
                )
            },
            ["user"],
        ),
        {"user": {"id": 7, "tags": ["a", "bc"]}},
    ),
    (
        "any_of",
        {
            "anyOf": [
                _obj(
                    {"kind": {"const": "circle"}, "r": {"type": "integer", "minimum": 1, "maximum": 10}},
                    ["kind", "r"],
                ),
                _obj(
                    {"kind": {"const": "square"}, "side": {"type": "integer", "minimum": 1, "maximum": 10}},
                    ["kind", "side"],
                ),
            ]
        },
        {"kind": "square", "side": 4},
    ),
    (
        "pattern",
        _obj({"date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}}, ["date"]),
        {"date": "2024-05-17"},
    ),
    (
        "top_array",
        {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 4},
        ["a", "c"],
    ),
    (
        "refs",
        {
            "$defs": {"point": _POINT},
            **_obj({"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}}, ["a", "b"]),
        },
        {"a": {"x": 1, "y": -2}, "b": {"x": 0, "y": 9}},
    ),
    (
        "optional",
        _obj(
            {
                "title": {"type": "string", "minLength": 1, "maxLength": 10},
                "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
                "draft": {"type": "boolean"},
            },
            ["title"],
        ),
        {"title": "Dune", "year": 1965},
    ),
]

REGEX = r"[A-Z][a-z]{2,8} [0-9]{1,3}"
REGEX_EXAMPLE = "Apollo 11"
CHOICES = ["positive", "negative", "neutral"]
