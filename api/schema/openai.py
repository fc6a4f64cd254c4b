"""OpenAI request bodies in, OpenAI response bodies out: plain functions shared by the HTTP API
and the offline batch runner. Bodies are validated by the pydantic models of api/schema/requests.py;
a bad one raises InvalidRequestError whose param names the (top-level) field."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from api.schema.requests import ChatBody, CompletionBody
from api.schema.structured import structured_outputs
from broker.errors import InvalidRequestError
from broker.messages import ChatMessage, GenerateJob, Usage
from broker.sampling import MAX_STOP_STRINGS, SamplingParams

Endpoint = Literal["/v1/chat/completions", "/v1/completions"]
ENDPOINTS: tuple[Endpoint, ...] = ("/v1/chat/completions", "/v1/completions")
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    endpoint: Endpoint
    model: str
    params: SamplingParams
    messages: tuple[dict[str, str], ...] = ()  # chat
    prompt: str | tuple[int, ...] = ""  # completions: text or token ids
    session_id: str | None = None
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a final chunk with usage
    cache_salt: str = ""  # as vLLM's: requests with different salts never share KV blocks

    @property
    def is_chat(self) -> bool:
        return self.endpoint == "/v1/chat/completions"

    def to_job(self, tenant: str = "") -> GenerateJob:
        return GenerateJob(
            model=self.model,
            endpoint="chat" if self.is_chat else "completion",
            messages=tuple(ChatMessage(m["role"], m["content"]) for m in self.messages),
            prompt=self.prompt if isinstance(self.prompt, str) and self.prompt else None,
            prompt_token_ids=self.prompt if isinstance(self.prompt, tuple) else (),
            params=self.params,
            session_id=self.session_id,
            tenant=tenant,
            submitted_at=time.time(),
            cache_salt=self.cache_salt,
        )


_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict"})  # pydantic's union member tags


def _where(loc: tuple[int | str, ...]) -> str:
    """("messages", 0, "content", "str") -> "messages[0].content"."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.replace("_", "").isalpha() and part.islower() and part not in _TAGS:
            out += ("." if out else "") + part
    return out or "body"


# Fields whose pydantic message (one per union member) would mislead: say what is expected.
_EXPECTED = {
    "prompt": "must be a non-empty string or a non-empty list of token ids in [0, 2**31)",
    "stop": f"must be a non-empty string or a list of at most {MAX_STOP_STRINGS} non-empty strings",
    "content": "must be a string or a list of text parts ({type: text, text: ...})",
}


def _invalid(exc: ValidationError) -> InvalidRequestError:
    first = exc.errors(include_url=False)[0]
    loc = tuple(first["loc"])
    param = str(loc[0]) if loc else "body"
    where = _where(loc)
    field = where.rsplit(".", 1)[-1].split("[")[0]
    if field in _EXPECTED and first["type"] not in ("literal_error", "missing"):
        return InvalidRequestError(f"{where}: {_EXPECTED[field]}", param)
    return InvalidRequestError(f"{where}: {first['msg']}", param)


def validate(model: type[M], body: Any) -> M:
    """The body as `model`, or an InvalidRequestError whose param names the first bad field."""
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object", "body")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise _invalid(exc) from None


def _params(b: ChatBody | CompletionBody, default_max_tokens: int | None) -> SamplingParams:
    max_tokens = b.max_tokens
    if isinstance(b, ChatBody) and b.max_completion_tokens is not None:
        max_tokens = b.max_completion_tokens
    stop = (b.stop,) if isinstance(b.stop, str) else tuple(b.stop or ())
    return SamplingParams(
        max_tokens=max_tokens if max_tokens is not None else default_max_tokens,
        temperature=1.0 if b.temperature is None else b.temperature,
        top_p=1.0 if b.top_p is None else b.top_p,
        top_k=b.top_k or 0,
        seed=b.seed,
        stop=stop,
        ignore_eos=bool(b.ignore_eos),
        structured_outputs=structured_outputs(b),
    )


def parse_request(endpoint: str, body: Any, chat_max_tokens: int | None = None) -> CompletionRequest:
    """An OpenAI body, validated. chat_max_tokens: a chat's max_tokens when it names none
    (None: until the context is full); a text completion's default is OpenAI's, 16."""
    if endpoint not in ENDPOINTS:
        raise InvalidRequestError(f"unsupported url {endpoint!r}; expected one of {list(ENDPOINTS)}", "url")
    b: ChatBody | CompletionBody
    if endpoint == "/v1/chat/completions":
        b = validate(ChatBody, body)
        messages = tuple(
            {"role": "system" if m.role == "developer" else m.role, "content": m.text} for m in b.messages
        )
        prompt: str | tuple[int, ...] = ""
        params = _params(b, chat_max_tokens)
    else:
        b = validate(CompletionBody, body)
        messages, prompt = (), b.prompt_value
        params = _params(b, 16)
    options = b.stream_options
    return CompletionRequest(
        endpoint,
        b.model,
        params,
        messages=messages,
        prompt=prompt,
        session_id=b.session_id,
        stream=bool(b.stream),
        include_usage=bool(options and options.include_usage),
        cache_salt=b.cache_salt or "",
    )


def usage_body(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        # where the prompt's KV came from (an extension; OpenAI clients ignore it)
        "kv_sources": {
            "pool": usage.pool_tokens,
            "warm": usage.warm_tokens,
            "redis": usage.redis_tokens,
            "computed": usage.computed_tokens,
        },
        # tokens a redelivered job computed again (0 unless its worker died or its engine failed)
        "recomputed_tokens": usage.recomputed_tokens,
    }


def response_body(
    request: CompletionRequest, text: str, finish_reason: str, usage: Usage, request_id: str | None = None
) -> dict[str, Any]:
    created = int(time.time())
    if request.is_chat:
        return {
            "id": request_id or f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": created,
            "model": request.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
            ],
            "usage": usage_body(usage),
        }
    return {
        "id": request_id or f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": created,
        "model": request.model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
        "usage": usage_body(usage),
    }


def error_body(
    message: str, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
