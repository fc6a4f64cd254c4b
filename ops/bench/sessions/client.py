"""One streamed chat turn over the plain OpenAI API, and what kind of server answers.

The server kind comes from GET /v1/models `owned_by`: kvferry says "kvferry", vLLM "vllm" (its
ModelCard default) and llama-server "llamacpp". Only kvferry gets `session_id`; kvferry, vLLM and
llama-server all read `ignore_eos` in a chat body, an unknown server gets only `max_tokens`. A
server that rejects a field with a 400 naming it gets the turn again without it (and the run stops
sending it), so the benchmark still measures it; replies shorter than asked are counted. A token's
chunk is one whose delta carries `content`, empty text included: a token may decode to no text
yet (vLLM streams "" for it), and its time still is the token's."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

KINDS = {"kvferry": "kvferry", "vllm": "vllm", "llamacpp": "llamacpp"}
IGNORE_EOS_KINDS = frozenset({"kvferry", "vllm", "llamacpp"})


def api_root(base_url: str) -> str:
    """The server root, whether the URL was given with /v1 (as the peers harness does) or not."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


@dataclass(frozen=True, slots=True)
class Server:
    kind: str  # kvferry / vllm / llamacpp / other
    model: str


async def detect(client: httpx.AsyncClient, model: str | None) -> Server:
    """The server's kind and the model to ask for (`model`, else the first /v1/models lists)."""
    response = await client.get("/v1/models")
    response.raise_for_status()
    data = response.json().get("data") or []
    owner = str(data[0].get("owned_by", "")) if data else ""
    name = model or (str(data[0]["id"]) if data else "")
    if not name:
        raise ValueError("the server lists no model; pass --model")
    return Server(KINDS.get(owner.lower(), "other"), name)


@dataclass(slots=True)
class Options:
    """What each request carries; `ignore_eos` is dropped for good once a server refuses it."""

    server: Server
    output_tokens: int
    ignore_eos: bool = True
    api_key: str = ""
    refused: list[str] = field(default_factory=list)

    def body(self, messages: list[dict[str, str]], sid: str, salt: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.server.model,
            "messages": messages,
            "max_tokens": self.output_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.ignore_eos and self.server.kind in IGNORE_EOS_KINDS:
            body["ignore_eos"] = True
        if self.server.kind == "kvferry":
            if salt is None:
                body["session_id"] = sid
            else:
                body["cache_salt"] = salt
        return body


@dataclass(frozen=True, slots=True)
class Turn:
    """One request's outcome (times in seconds; NaN where there was no token)."""

    ttft_s: float
    tpot_s: float
    latency_s: float
    prompt_tokens: int
    cached_tokens: int | None  # None: the server did not say
    completion_tokens: int
    text: str
    worker: str
    error: str
    sources: tuple[int, int, int, int] | None = None  # kvferry's kv_sources: pool, warm, redis, computed


def _sources(usage: dict[str, Any]) -> tuple[int, int, int, int] | None:
    got = usage.get("kv_sources")
    if not isinstance(got, dict):
        return None
    pool, warm, redis, computed = (int(got.get(k, 0)) for k in ("pool", "warm", "redis", "computed"))
    return pool, warm, redis, computed


def _cached(usage: dict[str, Any], timings: dict[str, Any]) -> int | None:
    details = usage.get("prompt_tokens_details") or {}
    if details.get("cached_tokens") is not None:
        return int(details["cached_tokens"])
    if timings.get("cache_n") is not None:  # llama-server's own report of reused prompt tokens
        return int(timings["cache_n"])
    return None


async def chat_turn(
    client: httpx.AsyncClient,
    opts: Options,
    messages: list[dict[str, str]],
    sid: str,
    salt: str | None = None,
) -> Turn:
    """Send one streamed turn; on a 400 that names `ignore_eos`, once more without it."""
    turn = await _send(client, opts, opts.body(messages, sid, salt))
    if turn.error.startswith("400") and "ignore_eos" in turn.error and opts.ignore_eos:
        opts.ignore_eos = False
        opts.refused.append("ignore_eos")
        turn = await _send(client, opts, opts.body(messages, sid, salt))
    return turn


async def _send(client: httpx.AsyncClient, opts: Options, body: dict[str, Any]) -> Turn:
    headers = {"Authorization": f"Bearer {opts.api_key}"} if opts.api_key else {}
    nan = float("nan")
    started = time.perf_counter()
    first = last = nan
    pieces: list[str] = []
    chunks = 0
    usage: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    worker = ""
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
            worker = response.headers.get("x-kvferry-worker", "")
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                return Turn(nan, nan, time.perf_counter() - started, 0, None, 0, "", worker,
                            f"{response.status_code} {text[:300]}")  # fmt: skip
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                choices = chunk.get("choices") or []
                content = choices[0].get("delta", {}).get("content") if choices else None
                if content is not None:  # a token's chunk, even one whose text is empty
                    last = time.perf_counter()
                    first = last if first != first else first
                    pieces.append(content)
                    chunks += bool(content)
                usage = chunk.get("usage") or usage
                timings = chunk.get("timings") or timings
                worker = (chunk.get("x_kvferry") or {}).get("worker", worker)
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        return Turn(
            nan, nan, time.perf_counter() - started, 0, None, 0, "", worker, f"{type(exc).__name__}: {exc}"
        )
    completion = int(usage.get("completion_tokens") or chunks)
    tpot = (last - first) / (completion - 1) if completion > 1 and first == first else nan
    return Turn(
        first - started,
        tpot,
        time.perf_counter() - started,
        int(usage.get("prompt_tokens") or 0),
        _cached(usage, timings),
        completion,
        "".join(pieces),
        worker,
        "" if first == first else "no token streamed",
        _sources(usage),
    )
