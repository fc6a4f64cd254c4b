"""OpenAI request bodies in: a body, validated (api/schema/validation.py) by the pydantic models
of api/schema/requests.py, becomes a CompletionRequest and its jobs. Shared by the HTTP API and
the offline batch runner; the response bodies are api/schema/answer/bodies.py's."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import msgspec
from pydantic import BaseModel

from api.schema.requests import ChatBody, CompletionBody, Message
from api.schema.structured import structured_outputs
from api.schema.tool_choice import ToolCalling, chat_message, tool_calling
from api.schema.validation import validate
from broker.errors import InvalidRequestError
from broker.messages import ChatMessage, GenerateJob
from broker.sampling import SEED_MAX, SamplingParams
from broker.sessions import cache_key

Endpoint = Literal["/v1/chat/completions", "/v1/completions"]
ENDPOINTS: tuple[Endpoint, ...] = ("/v1/chat/completions", "/v1/completions")
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    endpoint: Endpoint
    model: str
    params: SamplingParams
    messages: tuple[ChatMessage, ...] = ()  # chat
    prompt: str | tuple[int, ...] = ""  # completions: text or token ids
    session_id: str | None = None
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a final chunk with usage
    cache_salt: str = ""  # as vLLM's: requests with different salts never share KV blocks
    echo: bool = False  # completions: the prompt comes back before the completion
    more_prompts: tuple[str | tuple[int, ...], ...] = ()  # completions: the batch's other prompts
    n: int = 1  # choices per prompt
    best_of: int = 1  # candidates per prompt (>= n); the n with the highest logprob sum come back
    tool_calling: ToolCalling | None = None  # chat with tools the model may call
    priority: int = 0  # vLLM's: lower is served earlier, within the job's class (broker/priority.py)

    @property
    def choices_per_prompt(self) -> int:
        return max(self.n, self.best_of)

    @property
    def fans_out(self) -> bool:
        """Several jobs answer it: several prompts, or several choices of one."""
        return bool(self.more_prompts) or self.choices_per_prompt > 1

    @property
    def is_chat(self) -> bool:
        return self.endpoint == "/v1/chat/completions"

    @property
    def wants_logprobs(self) -> bool:
        return self.params.logprobs is not None

    def split(self) -> list[list[CompletionRequest]]:
        """For each prompt of a batch, one request per candidate choice: candidate i draws from
        its own generator, seeded with seed + i (mod 2**64) when the request names a seed; best_of
        candidates report their logprobs, which rank them."""
        out: list[list[CompletionRequest]] = []
        for prompt in (self.prompt, *self.more_prompts):
            group = []
            for i in range(self.choices_per_prompt):
                params = self.params
                if params.seed is not None:
                    params = msgspec.structs.replace(params, seed=(params.seed + i) % (SEED_MAX + 1))
                if self.best_of > self.n and params.logprobs is None:
                    params = msgspec.structs.replace(params, logprobs=0)
                one = dataclasses.replace(self, prompt=prompt, more_prompts=(), n=1, best_of=1, params=params)
                group.append(one)
            out.append(group)
        return out

    def to_job(self, tenant: str = "") -> GenerateJob:
        return GenerateJob(
            model=self.model,
            endpoint="chat" if self.is_chat else "completion",
            messages=self.messages,
            prompt=self.prompt if isinstance(self.prompt, str) and self.prompt else None,
            prompt_token_ids=self.prompt if isinstance(self.prompt, tuple) else (),
            params=self.params,
            session_id=self.session_id,
            tenant=tenant,
            submitted_at=time.time(),
            cache_salt=self.cache_salt,
            echo=self.echo,
            tools=self.tool_calling.tools if self.tool_calling else (),
            priority=self.priority,
        )


def chat_messages(messages: Sequence[Message]) -> tuple[dict[str, str], ...]:
    """Messages as the chat template takes them (the worker's, and /tokenize's)."""
    return tuple({"role": "system" if m.role == "developer" else m.role, "content": m.text} for m in messages)


def _params(b: ChatBody | CompletionBody, default_max_tokens: int | None) -> SamplingParams:
    max_tokens = b.max_tokens
    if isinstance(b, ChatBody) and b.max_completion_tokens is not None:
        max_tokens = b.max_completion_tokens
    stop = (b.stop,) if isinstance(b.stop, str) else tuple(b.stop or ())
    if isinstance(b, ChatBody):
        logprobs = (b.top_logprobs or 0) if b.logprobs else None
        prompt_logprobs = None
    else:
        logprobs = b.logprobs
        prompt_logprobs = b.logprobs if b.echo else None  # echo's prompt comes with its logprobs
    return SamplingParams(
        max_tokens=max_tokens if max_tokens is not None else default_max_tokens,
        temperature=1.0 if b.temperature is None else b.temperature,
        top_p=1.0 if b.top_p is None else b.top_p,
        top_k=b.top_k or 0,
        seed=b.seed,
        stop=stop,
        ignore_eos=bool(b.ignore_eos),
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        frequency_penalty=b.frequency_penalty or 0.0,
        presence_penalty=b.presence_penalty or 0.0,
        repetition_penalty=1.0 if b.repetition_penalty is None else b.repetition_penalty,
        logit_bias=tuple((int(token), bias) for token, bias in (b.logit_bias or {}).items()),
        min_p=b.min_p or 0.0,
        min_tokens=b.min_tokens or 0,
        stop_token_ids=tuple(b.stop_token_ids or ()),
        structured_outputs=structured_outputs(b),
    )


def _cache_session(b: ChatBody | CompletionBody) -> str | None:
    key = getattr(b, "prompt_cache_key", None)
    return cache_key.session_of(key) if key else None


def parse_request(
    endpoint: str, body: Any, chat_max_tokens: int | None = None, tool_parser: str = "hermes"
) -> CompletionRequest:
    """An OpenAI body, validated. chat_max_tokens: a chat's max_tokens when it names none
    (None: until the context is full); a text completion's default is OpenAI's, 16.
    tool_parser: the tool-call format (api/tool_calls/parser.py) of the served model."""
    if endpoint not in ENDPOINTS:
        raise InvalidRequestError(f"unsupported url {endpoint!r}; expected one of {list(ENDPOINTS)}", "url")
    b: ChatBody | CompletionBody
    if endpoint == "/v1/chat/completions":
        b = validate(ChatBody, body)
        messages = tuple(chat_message(m) for m in b.messages)
        prompt: str | tuple[int, ...] = ""
        more: tuple[str | tuple[int, ...], ...] = ()
        best_of = 1
        params = _params(b, chat_max_tokens)
        tools = tool_calling(b, tool_parser)
        if tools is not None and (forced := tools.constraint()) is not None:
            if params.structured_outputs is not None:
                raise InvalidRequestError(
                    f"tool_choice {tools.mode} constrains the output: it excludes "
                    f"{params.structured_outputs.source}",
                    "tool_choice",
                )
            params = msgspec.structs.replace(params, structured_outputs=forced)
    else:
        b = validate(CompletionBody, body)
        prompts = b.prompt_values
        messages, prompt, more, tools = (), prompts[0], tuple(prompts[1:]), None
        best_of = b.best_of or b.n or 1  # OpenAI's default: n
        if best_of < (b.n or 1):
            raise InvalidRequestError(f"best_of ({best_of}) must be at least n ({b.n})", "best_of")
        if best_of > (b.n or 1) and b.stream:
            raise InvalidRequestError(
                "best_of above n cannot stream: the best are known at the end only", "best_of"
            )
        params = _params(b, 16)
    options = b.stream_options
    return CompletionRequest(
        endpoint,
        b.model,
        params,
        messages=messages,
        prompt=prompt,
        session_id=b.session_id or _cache_session(b),
        stream=bool(b.stream),
        include_usage=bool(options and options.include_usage),
        cache_salt=b.cache_salt or "",
        echo=bool(getattr(b, "echo", None)),
        more_prompts=more,
        n=b.n or 1,
        best_of=max(best_of, b.n or 1),
        tool_calling=tools,
        priority=b.priority or 0,
    )
