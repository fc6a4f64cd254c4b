"""OpenAI request bodies in, OpenAI response bodies out: plain functions shared by the HTTP API
and the offline batch runner. Validation raises InvalidRequestError naming the bad field."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from broker.errors import InvalidRequestError
from broker.messages import ChatMessage, GenerateJob, Usage
from broker.sampling import SamplingParams

Endpoint = Literal["/v1/chat/completions", "/v1/completions"]
ENDPOINTS: tuple[Endpoint, ...] = ("/v1/chat/completions", "/v1/completions")
_ROLES = frozenset({"system", "user", "assistant", "developer", "tool"})


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
        )


def _text_content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        parts = []
        for part in content:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise InvalidRequestError(f"{where}: only text content parts are supported", "messages")
            parts.append(part["text"])
        return "".join(parts)
    raise InvalidRequestError(f"{where}: content must be a string or a list of text parts", "messages")


def _messages(raw: Any) -> tuple[dict[str, str], ...]:
    if not isinstance(raw, list) or not raw:
        raise InvalidRequestError("'messages' must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise InvalidRequestError(f"messages[{i}] must be an object", "messages")
        role = m.get("role")
        if role not in _ROLES:
            raise InvalidRequestError(f"messages[{i}].role must be one of {sorted(_ROLES)}", "messages")
        out.append(
            {
                "role": "system" if role == "developer" else role,
                "content": _text_content(m.get("content"), f"messages[{i}]"),
            }
        )
    return tuple(out)


def _prompt(raw: Any) -> str | tuple[int, ...]:
    if isinstance(raw, str):
        if not raw:
            raise InvalidRequestError("'prompt' is empty", "prompt")
        return raw
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], (str, list)):
        return _prompt(raw[0])  # a batch of one
    if isinstance(raw, list) and raw and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
        return tuple(raw)
    raise InvalidRequestError("'prompt' must be a non-empty string or a list of token ids", "prompt")


def _number(body: dict[str, Any], key: str, default: float, kind: type = float) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (kind is int and not isinstance(value, int))
    ):
        raise InvalidRequestError(f"'{key}' must be a{'n integer' if kind is int else ' number'}", key)
    return kind(value)


def sampling_params(body: dict[str, Any], default_max_tokens: int | None) -> SamplingParams:
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens", default_max_tokens))
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)):
        raise InvalidRequestError("'max_tokens' must be an integer", "max_tokens")
    stop = body.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (list, tuple)):
        raise InvalidRequestError("'stop' must be a string or a list of strings", "stop")
    if _number(body, "n", 1, int) != 1:
        raise InvalidRequestError("only n=1 is supported", "n")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise InvalidRequestError("'seed' must be an integer", "seed")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0),
        top_p=_number(body, "top_p", 1.0),
        top_k=_number(body, "top_k", 0, int),
        seed=seed,
        stop=tuple(stop),
        ignore_eos=bool(body.get("ignore_eos", False)),
    )


def parse_request(endpoint: str, body: Any) -> CompletionRequest:
    if endpoint not in ENDPOINTS:
        raise InvalidRequestError(f"unsupported url {endpoint!r}; expected one of {list(ENDPOINTS)}", "url")
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object", "body")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("'model' is required", "model")
    session = body.get("session_id")
    if session is not None and not isinstance(session, str):
        raise InvalidRequestError("'session_id' must be a string", "session_id")
    stream, include_usage = _stream_flags(body)
    if endpoint == "/v1/chat/completions":
        # OpenAI's chat default: generate until the context is full.
        return CompletionRequest(
            endpoint,
            model,
            sampling_params(body, None),
            messages=_messages(body.get("messages")),
            session_id=session,
            stream=stream,
            include_usage=include_usage,
        )
    return CompletionRequest(
        endpoint,
        model,
        sampling_params(body, 16),
        prompt=_prompt(body.get("prompt")),
        session_id=session,
        stream=stream,
        include_usage=include_usage,
    )


def _stream_flags(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequestError("'stream' must be a boolean", "stream")
    options = body.get("stream_options")
    if options is None:
        return bool(stream), False
    if not isinstance(options, dict):
        raise InvalidRequestError("'stream_options' must be an object", "stream_options")
    include_usage = options.get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise InvalidRequestError("'stream_options.include_usage' must be a boolean", "stream_options")
    return bool(stream), bool(include_usage)


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
