"""The sessions benchmark's client on its own: the server kind from /v1/models, which fields each
kind gets, TTFT/TPOT and usage from a stream, and a server that refuses `ignore_eos` (a 400 naming
it) measured anyway, without it. httpx's MockTransport stands in for the servers."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import httpx
import pytest

from ops.bench.sessions.client import Options, Server, api_root, chat_turn, detect


def _sse(chunks: list[dict[str, Any]]) -> bytes:
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks).encode() + b"data: [DONE]\n\n"


def _stream(n: int, usage: dict[str, Any] | None = None, timings: dict[str, Any] | None = None) -> bytes:
    chunks: list[dict[str, Any]] = [{"choices": [{"delta": {"content": f"t{i} "}}]} for i in range(n)]
    chunks.append({"choices": [], "usage": usage or {"prompt_tokens": 50, "completion_tokens": n}})
    if timings:
        chunks[-1]["timings"] = timings
    return _sse(chunks)


def _one_turn(kind: str, body: bytes, output_tokens: int) -> Any:
    """One chat turn against a server that answers every request with `body`."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body)

    async def go() -> Any:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://x") as c:
            opts = Options(Server(kind, "m"), output_tokens)
            return await chat_turn(c, opts, [{"role": "user", "content": "q"}], "s")

    return asyncio.run(go())


def test_api_root_takes_the_url_with_or_without_v1() -> None:
    assert api_root("http://h:1/v1") == api_root("http://h:1/v1/") == api_root("http://h:1") == "http://h:1"


@pytest.mark.parametrize(
    ("owned_by", "kind"),
    [("kvferry", "kvferry"), ("vllm", "vllm"), ("llamacpp", "llamacpp"), ("openai", "other")],
)
def test_detect_reads_owned_by(owned_by: str, kind: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"data": [{"id": "smollm2", "owned_by": owned_by}]})

    async def go() -> Server:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://x") as c:
            return await detect(c, None)

    assert asyncio.run(go()) == Server(kind, "smollm2")


def test_fields_by_kind() -> None:
    msgs = [{"role": "user", "content": "hi"}]
    kv = Options(Server("kvferry", "m"), 32).body(msgs, "s1", None)
    assert (
        kv["session_id"] == "s1"
        and kv["ignore_eos"] is True
        and kv["stream_options"] == {"include_usage": True}
    )
    assert Options(Server("kvferry", "m"), 32).body(msgs, "s1", "salt")["cache_salt"] == "salt"
    for kind in ("vllm", "llamacpp"):
        body = Options(Server(kind, "m"), 32).body(msgs, "s1", None)
        assert body["ignore_eos"] is True and "session_id" not in body
    other = Options(Server("other", "m"), 32).body(msgs, "s1", None)
    assert "ignore_eos" not in other and "session_id" not in other and other["max_tokens"] == 32


def test_a_turn_streams_ttft_tpot_and_cached_tokens() -> None:
    usage = {"prompt_tokens": 50, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 32}}
    turn = _one_turn("vllm", _stream(4, usage), 4)
    assert turn.error == "" and turn.text == "t0 t1 t2 t3 "
    assert turn.ttft_s >= 0 and turn.tpot_s >= 0
    assert (turn.prompt_tokens, turn.cached_tokens, turn.completion_tokens) == (50, 32, 4)


def test_llama_server_timings_give_cached_tokens() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=_stream(2, timings={"cache_n": 40}))

    async def go() -> Any:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://x") as c:
            return await chat_turn(
                c, Options(Server("llamacpp", "m"), 2), [{"role": "user", "content": "q"}], "s"
            )

    assert asyncio.run(go()).cached_tokens == 40


def test_tokens_whose_text_is_empty_still_time_the_turn() -> None:
    """vLLM streams a chunk per token even when its text is "" (a role chunk first): those chunks
    are tokens, and a role chunk without content is not."""
    chunks: list[dict[str, Any]] = [{"choices": [{"delta": {"role": "assistant"}}]}]
    chunks += [{"choices": [{"delta": {"content": ""}}]} for _ in range(3)]
    chunks.append({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3}})

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=_sse(chunks))

    async def go() -> Any:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://x") as c:
            return await chat_turn(
                c, Options(Server("vllm", "m"), 3), [{"role": "user", "content": "q"}], "s"
            )

    turn = asyncio.run(go())
    assert turn.error == "" and turn.text == "" and turn.completion_tokens == 3
    assert turn.ttft_s >= 0 and turn.tpot_s >= 0


def test_a_server_that_refuses_ignore_eos_is_asked_again_without_it() -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        if "ignore_eos" in body:
            return httpx.Response(
                400, json={"error": {"message": "Unrecognized request argument: ignore_eos"}}
            )
        return httpx.Response(200, content=_stream(2))

    opts = Options(Server("vllm", "m"), 8)

    async def go() -> Any:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://x") as c:
            first = await chat_turn(c, opts, [{"role": "user", "content": "q"}], "s")
            second = await chat_turn(c, opts, [{"role": "user", "content": "q"}], "s")
            return first, second

    first, second = asyncio.run(go())
    assert first.error == "" == second.error and first.completion_tokens == 2
    assert ["ignore_eos" in b for b in bodies] == [True, False, False]  # refused once, then never sent
    assert opts.refused == ["ignore_eos"] and opts.ignore_eos is False


def test_kvferry_kv_sources_land_in_the_records_and_the_per_turn_means() -> None:
    from ops.bench.sessions.run import _record
    from ops.bench.sessions.stats import per_turn

    usage = {
        "prompt_tokens": 50,
        "completion_tokens": 2,
        "kv_sources": {"pool": 16, "warm": 16, "redis": 0, "computed": 18},
    }
    turn = _one_turn("kvferry", _stream(2, usage), 2)
    assert turn.sources == (16, 16, 0, 18)
    row = per_turn([_record(1, "s", 1, turn, 2)], 1)[0]
    means = [row[f"kv_{k}_mean"] for k in ("pool", "warm", "redis", "computed")]
    assert means == [16, 16, 0, 18]
    assert "kv_pool_mean" not in per_turn([_record(1, "s", 1, replace(turn, sources=None), 2)], 1)[0]
