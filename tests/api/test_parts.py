"""The api's small parts on their own: job metadata, routing, chunk building, config."""

from __future__ import annotations

import json

from api.jobs.meta import JobMeta
from api.schema.answer.sse import DONE, ChunkWriter
from api.schema.openai import parse_request
from broker import keys
from broker.messages import Usage
from broker.sampling import SamplingParams


def test_job_meta_round_trips_through_a_redis_hash() -> None:
    params = SamplingParams(max_tokens=3, temperature=0.5, seed=2**64 - 1, stop=("x", "y"))
    meta = JobMeta("j1", "/v1/chat/completions", "m", keys.SHARED_QUEUE, "shared", 12.5, "t", "s", params)
    raw = {k.encode(): v.encode() for k, v in meta.to_hash().items()}
    assert JobMeta.from_hash("j1", raw) == meta
    assert meta.response_id == "chatcmpl-j1"
    assert meta.request().params.max_tokens == 3 and meta.request().is_chat
    no_session = JobMeta("j2", "/v1/completions", "m", "q", "r", 1.0)
    assert (
        JobMeta.from_hash("j2", {k.encode(): v.encode() for k, v in no_session.to_hash().items()})
        == no_session
    )
    assert no_session.response_id == "cmpl-j2"


def test_job_meta_holds_no_prompt() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "secret words"}], "max_tokens": 3}
    request = parse_request("/v1/chat/completions", body)
    meta = JobMeta("j1", request.endpoint, "m", "q", "r", 1.0, "t", None, request.params)
    assert "secret" not in json.dumps(meta.to_hash())


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
        "recomputed_tokens": 0,
    }
