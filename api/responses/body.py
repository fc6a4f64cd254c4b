"""POST /v1/responses' body, as pydantic models held to the same rules as the chat body
(api/schema/requests.py): every field typed and bounded, any other a 400 naming it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator

from api.schema.requests import MAX_MESSAGES, MAX_MODEL_CHARS, MAX_TOKENS_CAP, TopK, check_temperature
from api.schema.strict import Strict, unsupported
from api.schema.structured_fields import JsonSchema
from api.schema.tools import MAX_ARGUMENTS_CHARS, MAX_DESCRIPTION_CHARS, MAX_TOOLS, CallId, FunctionName
from broker.sampling import MAX_TEMPERATURE

LOGPROBS_INCLUDE = "message.output_text.logprobs"
MAX_OUTPUT_CHARS = 1 << 20  # a function_call_output's text
ResponseId = Annotated[str, Field(pattern=r"^resp_[A-Za-z0-9]{1,64}$")]
ConversationId = Annotated[str, Field(pattern=r"^conv_[A-Za-z0-9]{1,64}$")]
Metadata = Annotated[
    dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]], Field(max_length=16)
]


class InputText(Strict):
    type: Literal["input_text"]
    text: str


class OutputText(Strict):
    """An earlier answer's text sent back as input (what the SDKs do with a response's output)."""

    type: Literal["output_text"]
    text: str
    annotations: list[Any] | None = None  # always empty here: kvferry adds none
    logprobs: list[Any] | None = None  # an earlier answer's, sent back: not input to the model


class MessageItem(Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Annotated[InputText | OutputText, Field(discriminator="type")]]
    id: str | None = None  # an output message sent back
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class FunctionCallItem(Strict):
    type: Literal["function_call"]
    call_id: CallId
    name: FunctionName
    arguments: Annotated[str, Field(max_length=MAX_ARGUMENTS_CHARS)]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallOutputItem(Strict):
    type: Literal["function_call_output"]
    call_id: CallId
    output: Annotated[str, Field(max_length=MAX_OUTPUT_CHARS)]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


KNOWN_ITEMS = ("message", "function_call", "function_call_output")


def _item_type(item: Any) -> str:
    """An item's type; a message may leave it out (EasyInputMessage)."""
    kind = item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", "message")
    return str(kind)


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(_item_type),
]
Input = str | Annotated[list[InputItem], Field(min_length=1, max_length=MAX_MESSAGES)]


class FunctionTool(Strict):
    """Responses' function tool: flat, not nested under `function` as chat's."""

    type: Literal["function"]
    name: FunctionName
    description: Annotated[str, Field(max_length=MAX_DESCRIPTION_CHARS)] | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(Strict):
    type: Literal["function"]
    name: FunctionName


class TextFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")] | None = None  # json_schema's
    schema_: JsonSchema | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(Strict):
    format: TextFormat | None = None


class ConversationRef(Strict):
    id: ConversationId


class ResponsesBody(Strict):
    model: Annotated[str, Field(min_length=1, max_length=MAX_MODEL_CHARS)]
    input: Input
    instructions: str | None = None
    max_output_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS_CAP)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=MAX_TEMPERATURE, allow_inf_nan=False)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)] | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    metadata: Metadata | None = None
    user: Annotated[str, Field(max_length=256)] | None = None
    store: bool | None = None  # default true, as OpenAI's
    previous_response_id: ResponseId | None = None
    conversation: ConversationId | ConversationRef | None = None
    background: bool | None = None
    stream: bool | None = None
    prompt_cache_key: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    include: Annotated[list[Literal["message.output_text.logprobs"]], Field(max_length=4)] | None = None
    top_logprobs: TopK | None = None
    truncation: Literal["disabled", "auto"] | None = None

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, t: float | None) -> float | None:
        return check_temperature(t)

    @field_validator("truncation")
    @classmethod
    def _truncation(cls, t: str | None) -> str | None:
        if t == "auto":
            raise unsupported("kvferry never drops input items: only truncation 'disabled' is supported")
        return t

    @property
    def stored(self) -> bool:
        return self.store is not False

    @property
    def conversation_id(self) -> str | None:
        c = self.conversation
        return c.id if isinstance(c, ConversationRef) else c

    @property
    def wants_logprobs(self) -> bool:
        return LOGPROBS_INCLUDE in (self.include or ())
