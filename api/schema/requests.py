"""The request bodies the edge accepts, as pydantic models: every field typed (strictly: "false"
is not a boolean, 1.0 is not an integer) and bounded. They also describe the bodies in the
OpenAPI schema. Nothing is silently ignored: a field is supported exactly when a model here
declares it; any other (an OpenAI field kvferry does not implement, a typo) is a 400
`unsupported_parameter` naming it (api/schema/validation.py). The few fields that change nothing
are declared on `_NoOp`, each with the reason it is safe to accept."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from api.schema.strict import Strict as _Strict
from api.schema.strict import unsupported
from api.schema.structured_fields import StructuredFields
from api.schema.tools import CallId, ToolCalls, ToolChoice, Tools
from broker.penalty_params import (
    LOGIT_BIAS_MAX,
    MAX_LOGIT_BIAS,
    MAX_REPETITION_PENALTY,
    MAX_STOP_TOKEN_IDS,
    PENALTY_MAX,
)
from broker.priority import PRIORITY_LIMIT
from broker.sampling import MAX_LOGPROBS, MAX_STOP_STRINGS, MAX_TEMPERATURE, MIN_TEMPERATURE, SEED_MAX

# A session id or cache salt: safe in a URL path segment and a Redis key; no '/', no spaces, and
# a letter or digit first (clients rewrite the path segments "." and "..": never addressable).
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
MAX_TOKENS_CAP = 1 << 20  # far above any context; the worker checks against the real one
TOKEN_ID_LIMIT = 1 << 31  # the worker checks against the true vocabulary (a 400 there too)
MAX_MODEL_CHARS = 256
MAX_MESSAGES = 4096
MAX_PROMPTS = 128  # prompts in one /v1/completions (each its own job, under the tenant's job cap)
MAX_N = 64  # n and best_of: choices (jobs) per prompt

Id = Annotated[str, Field(pattern=ID_PATTERN)]
TokenId = Annotated[int, Field(ge=0, lt=TOKEN_ID_LIMIT)]
TopK = Annotated[int, Field(ge=0, le=MAX_LOGPROBS)]
NonEmpty = Annotated[str, Field(min_length=1)]
Penalty = Annotated[float, Field(ge=-PENALTY_MAX, le=PENALTY_MAX, allow_inf_nan=False)]
# logit_bias keys are token ids written as decimal strings (OpenAI's): no sign, no leading zero.
LogitBiasKey = Annotated[str, Field(pattern=r"^(0|[1-9][0-9]{0,9})$")]
LogitBias = Annotated[float, Field(ge=-LOGIT_BIAS_MAX, le=LOGIT_BIAS_MAX, allow_inf_nan=False)]


def check_temperature(t: float | None) -> float | None:
    if t is not None and t != 0 and t < MIN_TEMPERATURE:
        # below it logits / temperature overflow: the job would fail mid-step
        raise ValueError(f"must be 0 (greedy) or at least {MIN_TEMPERATURE}")
    return t


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    # null (or absent) only in an assistant message that calls tools, as OpenAI's
    content: str | list[TextPart] | None = None
    tool_calls: ToolCalls | None = None  # assistant only
    tool_call_id: CallId | None = None  # tool only: the call it answers

    @model_validator(mode="after")
    def _tool_fields(self) -> Message:
        if self.tool_calls is not None and self.role != "assistant":
            raise PydanticCustomError("tool_calls", "tool_calls: only an assistant message makes calls")
        if self.tool_call_id is not None and self.role != "tool":
            raise PydanticCustomError("tool_call_id", "tool_call_id: only a tool message answers a call")
        if self.role == "tool" and self.tool_call_id is None:
            raise PydanticCustomError(
                "tool_call_id", "tool_call_id: a tool message names the call it answers"
            )
        if self.content is None and self.tool_calls is None:
            raise PydanticCustomError("content", "content: required (null only with tool_calls)")
        return self

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class StreamOptions(_Strict):
    include_usage: bool | None = None


# -- structured outputs (api/schema/structured.py turns these into broker/structured.py's spec) --


class _NoOp(_Strict):
    """The allow-list: OpenAI fields accepted although they change nothing, because honouring
    them needs nothing of kvferry. Each is bounded, so a malformed one is still a 400."""

    # An end-user id OpenAI uses for abuse monitoring; kvferry's tenant is the API key.
    user: Annotated[str, Field(max_length=256)] | None = None
    # Tags for stored completions; with store false they go nowhere. OpenAI's limits.
    metadata: (
        Annotated[
            dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
            Field(max_length=16),
        ]
        | None
    ) = None
    # kvferry stores no completion: false (OpenAI's default) is what it does anyway.
    store: bool | None = None
    # One tier here: "auto" and "default" both name it; the others promise what kvferry lacks.
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None

    @field_validator("store")
    @classmethod
    def _store(cls, store: bool | None) -> bool | None:
        if store:
            raise unsupported("kvferry does not store completions; only false is accepted")
        return store

    @field_validator("service_tier")
    @classmethod
    def _service_tier(cls, tier: str | None) -> str | None:
        if tier not in (None, "auto", "default"):
            raise unsupported(f"kvferry has one service tier; {tier!r} is not supported (auto or default)")
        return tier


class _Common(_NoOp, StructuredFields):
    model: Annotated[str, Field(min_length=1, max_length=MAX_MODEL_CHARS)]
    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS_CAP)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=MAX_TEMPERATURE, allow_inf_nan=False)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)] | None = None
    top_k: Annotated[int, Field(ge=-1, lt=TOKEN_ID_LIMIT)] | None = None  # -1 and 0 disable it
    seed: Annotated[int, Field(ge=0, le=SEED_MAX)] | None = None
    stop: NonEmpty | Annotated[list[NonEmpty], Field(max_length=MAX_STOP_STRINGS)] | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    ignore_eos: bool | None = None
    session_id: Id | None = None
    cache_salt: Id | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    repetition_penalty: (
        Annotated[float, Field(gt=0.0, le=MAX_REPETITION_PENALTY, allow_inf_nan=False)] | None
    ) = None
    logit_bias: Annotated[dict[LogitBiasKey, LogitBias], Field(max_length=MAX_LOGIT_BIAS)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)] | None = None
    min_tokens: Annotated[int, Field(ge=0, le=MAX_TOKENS_CAP)] | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    # vLLM's: lower is served earlier (default 0), among the jobs of its class (broker/priority.py)
    priority: Annotated[int, Field(ge=-PRIORITY_LIMIT, le=PRIORITY_LIMIT)] | None = None

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, t: float | None) -> float | None:
        return check_temperature(t)

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        if bias is not None and any(int(token) >= TOKEN_ID_LIMIT for token in bias):
            raise ValueError("token ids must be below 2**31")  # the worker checks the vocabulary
        return bias


class ChatBody(_Common):
    """POST /v1/chat/completions."""

    messages: Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS_CAP)] | None = None
    logprobs: bool | None = None
    top_logprobs: TopK | None = None  # needs logprobs: true, as OpenAI's
    tools: Tools | None = None
    tool_choice: ToolChoice | None = None  # default: auto with tools, none without
    parallel_tool_calls: bool | None = None  # default true, as OpenAI's
    # the session's routing key, per tenant (broker/sessions/cache_key.py); session_id wins
    prompt_cache_key: Annotated[str, Field(min_length=1, max_length=256)] | None = None

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs(cls, k: int | None, info: ValidationInfo) -> int | None:
        if k is not None and info.data.get("logprobs") is not True:
            raise ValueError("needs logprobs: true")
        return k


TokenIds = Annotated[list[TokenId], Field(min_length=1)]
Prompt = (
    NonEmpty
    | TokenIds
    | Annotated[list[NonEmpty], Field(min_length=1, max_length=MAX_PROMPTS)]
    | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)]
)


class CompletionBody(_Common):
    """POST /v1/completions."""

    prompt: Prompt
    # 0 with echo: the prompt alone, with its logprobs (what lm-eval's loglikelihood asks)
    max_tokens: Annotated[int, Field(ge=0, le=MAX_TOKENS_CAP)] | None = None
    logprobs: TopK | None = None
    echo: bool | None = None
    best_of: Annotated[int, Field(ge=1, le=MAX_N)] | None = None  # >= n: the n likeliest come back

    @property
    def prompt_values(self) -> list[str | tuple[int, ...]]:
        """Each prompt of the body: one, or a batch of several."""
        p: Any = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            p = [p]
        return [q if isinstance(q, str) else tuple(q) for q in p]


class JobBody(_Strict):
    """POST /v1/jobs: a completion request to queue."""

    endpoint: Literal["/v1/chat/completions", "/v1/completions"]
    body: ChatBody | CompletionBody
