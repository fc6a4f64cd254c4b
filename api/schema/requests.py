"""The request bodies the edge accepts, as pydantic models: every field typed (strictly: "false"
is not a boolean, 1.0 is not an integer) and bounded. They also describe the bodies in the
OpenAPI schema. Fields OpenAI defines that kvferry does not implement are ignored, except those
below that are bounded so that a bad value is still a 400 (see IGNORED_FIELDS)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from broker.sampling import MAX_STOP_STRINGS, MAX_TEMPERATURE, MIN_TEMPERATURE, SEED_MAX
from broker.structured import MAX_CHOICES

# A session id or cache salt: safe in a URL path segment and a Redis key; no '/', no spaces, and
# a letter or digit first (clients rewrite the path segments "." and "..": never addressable).
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
MAX_TOKENS_CAP = 1 << 20  # far above any context; the worker checks against the real one
TOKEN_ID_LIMIT = 1 << 31  # the worker checks against the true vocabulary (a 400 there too)
MAX_MODEL_CHARS = 256
MAX_MESSAGES = 4096

# OpenAI request fields accepted and ignored (docs/api.md, the request fields).
IGNORED_FIELDS = (
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "user",
    "metadata",
    "store",
    "service_tier",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "functions",
    "function_call",
    "modalities",
    "audio",
    "prediction",
    "reasoning_effort",
    "web_search_options",
    "echo",
    "best_of",
    "suffix",
    "messages[].name",
)

Id = Annotated[str, Field(pattern=ID_PATTERN)]
TokenId = Annotated[int, Field(ge=0, lt=TOKEN_ID_LIMIT)]
NonEmpty = Annotated[str, Field(min_length=1)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0, allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart]

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class StreamOptions(_Strict):
    include_usage: bool | None = None


# -- structured outputs (api/schema/structured.py turns these into broker/structured.py's spec) --

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


class _Common(StructuredFields):
    model: Annotated[str, Field(min_length=1, max_length=MAX_MODEL_CHARS)]
    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS_CAP)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=MAX_TEMPERATURE, allow_inf_nan=False)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)] | None = None
    top_k: Annotated[int, Field(ge=-1, lt=TOKEN_ID_LIMIT)] | None = None  # -1 and 0 disable it
    seed: Annotated[int, Field(ge=0, le=SEED_MAX)] | None = None
    stop: NonEmpty | Annotated[list[NonEmpty], Field(max_length=MAX_STOP_STRINGS)] | None = None
    n: Annotated[int, Field(ge=1, le=1)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    ignore_eos: bool | None = None
    session_id: Id | None = None
    cache_salt: Id | None = None
    frequency_penalty: Penalty | None = None  # accepted, ignored
    presence_penalty: Penalty | None = None  # accepted, ignored
    user: Annotated[str, Field(max_length=256)] | None = None  # accepted, ignored

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, t: float | None) -> float | None:
        if t is not None and t != 0 and t < MIN_TEMPERATURE:
            # below it logits / temperature overflow: the job would fail mid-step
            raise ValueError(f"must be 0 (greedy) or at least {MIN_TEMPERATURE}")
        return t


class ChatBody(_Common):
    """POST /v1/chat/completions."""

    messages: Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS_CAP)] | None = None


Prompt = (
    NonEmpty
    | Annotated[list[TokenId], Field(min_length=1)]
    | Annotated[list[NonEmpty], Field(min_length=1, max_length=1)]  # a batch of one
    | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1, max_length=1)]
)


class CompletionBody(_Common):
    """POST /v1/completions."""

    prompt: Prompt

    @property
    def prompt_value(self) -> str | tuple[int, ...]:
        p: Any = self.prompt
        if isinstance(p, list) and isinstance(p[0], (str, list)):
            p = p[0]  # a batch of one
        return p if isinstance(p, str) else tuple(p)


class JobBody(_Strict):
    """POST /v1/jobs: a completion request to queue."""

    endpoint: Literal["/v1/chat/completions", "/v1/completions"]
    body: ChatBody | CompletionBody
