"""The bodies of /tokenize and /detokenize, in vLLM's shapes: as strict as the completion bodies
(api/schema/requests.py), and a field these models do not declare is a 400 unsupported_parameter
too (vLLM's return_token_strs, continue_final_message, chat_template, tools among them)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from api.schema.requests import MAX_MESSAGES, MAX_MODEL_CHARS, MAX_TOKENS_CAP, Message, TokenId
from api.schema.strict import unsupported

# Far above any context, and it bounds the thread's time per request (the body's own size bound
# would allow more).
MAX_TOKENIZE_CHARS = 1 << 20
Model = Annotated[str, Field(min_length=1, max_length=MAX_MODEL_CHARS)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class TokenizeCompletionBody(_Strict):
    """POST /tokenize with a prompt: its ids as a text completion would see them."""

    model: Model | None = None  # vLLM's: optional; when given, it must be the served model
    prompt: Annotated[str, Field(max_length=MAX_TOKENIZE_CHARS)]
    add_special_tokens: bool = True


class TokenizeChatBody(_Strict):
    """POST /tokenize with messages: the ids of the prompt a chat completion would run."""

    model: Model | None = None
    messages: Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES)]
    add_generation_prompt: bool = True
    # A worker adds none beyond the chat template's own: true would answer ids no job runs.
    add_special_tokens: bool = False

    @field_validator("add_special_tokens")
    @classmethod
    def _no_special_tokens(cls, add: bool) -> bool:
        if add:
            raise unsupported("with messages, only false: the chat template places the special tokens")
        return add


class DetokenizeBody(_Strict):
    """POST /detokenize."""

    model: Model | None = None
    tokens: Annotated[list[TokenId], Field(max_length=MAX_TOKENS_CAP)]


def tokenize_model(body: Any) -> type[TokenizeCompletionBody] | type[TokenizeChatBody]:
    """Which body a /tokenize document is: vLLM tells them apart by `messages`."""
    return TokenizeChatBody if isinstance(body, dict) and "messages" in body else TokenizeCompletionBody
