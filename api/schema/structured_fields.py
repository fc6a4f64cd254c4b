"""The structured-output fields of a request body (api/schema/structured.py turns them into
broker/structured.py's spec)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from api.schema.strict import Strict as _Strict
from broker.structured import MAX_CHOICES

JsonSchema = dict[str, Any]
Choices = Annotated[list[str], Field(min_length=1, max_length=MAX_CHOICES)]


class JsonSchemaFormat(_Strict):
    """response_format.json_schema, as OpenAI's (`strict` is accepted: the output always
    follows the schema)."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: str | None = None
    schema_: JsonSchema = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None  # required with type json_schema


class StructuredOutputsBody(_Strict):
    """vLLM's structured_outputs: exactly one of these."""

    json_: JsonSchema | str | None = Field(default=None, alias="json")
    json_object: bool | None = None
    regex: str | None = None
    choice: Choices | None = None
    grammar: str | None = None


class StructuredFields(_Strict):
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsBody | None = None
    # vLLM's older names for structured_outputs' fields
    guided_json: JsonSchema | str | None = None
    guided_regex: str | None = None
    guided_choice: Choices | None = None
    guided_grammar: str | None = None
