"""The api's small parts on their own: job metadata, routing, chunk building, config."""

from __future__ import annotations

import json

from api.job_meta import JobMeta
from api.openai_schema import parse_request
from api.sse import DONE, ChunkWriter
from broker import keys
from broker.messages import Usage


def test_job_meta_round_trips_through_a_redis_hash() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "héllo"}], "max_tokens": 3}
    meta = JobMeta("j1", "/v1/chat/completions", "m", keys.SHARED_QUEUE, "shared", 12.5, body, "t", "s")
    raw = {k.encode(): v.encode() for k, v in meta.to_hash().items()}
    assert JobMeta.from_hash("j1", raw) == meta
    assert meta.response_id == "chatcmpl-j1"
    assert meta.request().params.max_tokens == 3
    no_session = JobMeta("j2", "/v1/completions", "m", "q", "r", 1.0, {"model": "m", "prompt": "x"})
    assert (
        JobMeta.from_hash("j2", {k.encode(): v.encode() for k, v in no_session.to_hash().items()})
        == no_session
    )
    assert no_session.response_id == "cmpl-j2"


def decode(frame: bytes) -> dict[str, object]:
    assert frame.startswith(b"data: ") and frame.endswith(b"\n\n")
    doc: dict[str, object] = json.loads(frame[len(b"data: ") : -2])
    return doc


def test_chat_chunks() -> None:
    request = parse_request(
        "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    )
    w = ChunkWriter(request, "chatcmpl-1", 7)
    first, second, last = decode(w.text("")), decode(w.text("Hi")), decode(w.text("", "stop"))
    assert first["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]
    assert second["choices"] == [
        {"index": 0, "delta": {"content": "Hi"}, "logprobs": None, "finish_reason": None}
    ]
    assert last["choices"] == [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]
    assert (
        first["object"] == "chat.completion.chunk" and first["id"] == "chatcmpl-1" and first["created"] == 7
    )
    assert "usage" not in first
    assert DONE == b"data: [DONE]\n\n"


def test_completion_chunks_with_usage() -> None:
    request = parse_request(
        "/v1/completions",
        {"model": "m", "prompt": "x", "stream": True, "stream_options": {"include_usage": True}},
    )
    assert request.stream and request.include_usage
    w = ChunkWriter(request, "cmpl-1", 7)
    chunk = decode(w.text("ab"))
    assert chunk["object"] == "text_completion" and chunk["usage"] is None
    assert chunk["choices"] == [{"index": 0, "text": "ab", "logprobs": None, "finish_reason": None}]
    usage = decode(w.usage(Usage(5, 2, 3, pool_tokens=2, redis_tokens=1)))
    assert usage["choices"] == []
    assert usage["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 2,
        "total_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 3},
        "kv_sources": {"pool": 2, "warm": 0, "redis": 1, "computed": 2},
    }
