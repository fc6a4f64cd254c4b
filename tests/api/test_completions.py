"""Chat and text completions over HTTP against the fake worker: bodies, SSE, failures."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
import redis

from api.answer.completion import JOB_ID_HEADER
from broker import keys
from tests.api.conftest import MODEL, Served
from tests.api.fake_worker import FakeWorker

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


def sse_data(response: httpx.Response) -> list[str]:
    """The data payloads of an SSE body, checking its framing."""
    assert response.headers["content-type"].startswith("text/event-stream")
    frames = response.text.split("\n\n")
    assert frames[-1] == ""
    assert all(f.startswith("data: ") for f in frames[:-1])
    return [f.removeprefix("data: ") for f in frames[:-1]]


def test_chat_body_shape_and_cached_tokens(api: Served, worker: FakeWorker) -> None:
    with api.client() as c:
        r = c.post(CHAT, json=chat("hi", max_tokens=8))
    assert r.status_code == 200
    body = r.json()
    job_id = r.headers[JOB_ID_HEADER]
    assert body["id"] == f"chatcmpl-{job_id}"
    assert body["object"] == "chat.completion"
    assert body["model"] == MODEL
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello, world"},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    assert body["usage"] == {
        "prompt_tokens": 7,
        "completion_tokens": 3,
        "total_tokens": 10,
        "prompt_tokens_details": {"cached_tokens": 4},
        "kv_sources": {"pool": 0, "warm": 0, "redis": 0, "computed": 3},
        "recomputed_tokens": 0,
    }
    (seen,) = worker.seen
    assert seen.job_id == job_id
    assert seen.job.endpoint == "chat" and seen.job.params.max_tokens == 8 and seen.job.tenant == ""


def test_text_completion_body(api: Served, worker: FakeWorker) -> None:
    with api.client() as c:
        r = c.post(COMPLETIONS, json={"model": MODEL, "prompt": "Once", "max_tokens": 3})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"][0]["text"] == "Hello, world"
    assert worker.seen[0].job.prompt == "Once" and worker.seen[0].job.endpoint == "completion"


def test_chat_stream_chunks_and_done(api: Served, worker: FakeWorker) -> None:
    with api.client() as c:
        r = c.post(CHAT, json=chat("hi", stream=True))
    assert r.status_code == 200
    data = sse_data(r)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    job_id = r.headers[JOB_ID_HEADER]
    assert {ch["id"] for ch in chunks} == {f"chatcmpl-{job_id}"}
    assert {ch["object"] for ch in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all("role" not in ch["choices"][0]["delta"] for ch in chunks[1:])
    text = "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks)
    assert text == "Hello, world"
    assert [ch["choices"][0]["finish_reason"] for ch in chunks] == [None] * (len(chunks) - 1) + ["stop"]
    assert all("usage" not in ch for ch in chunks)


def test_stream_include_usage_sends_a_usage_chunk(api: Served, worker: FakeWorker) -> None:
    with api.client() as c:
        r = c.post(CHAT, json=chat("hi", stream=True, stream_options={"include_usage": True}))
    chunks = [json.loads(d) for d in sse_data(r)[:-1]]
    assert all(ch["usage"] is None for ch in chunks[:-1])
    last = chunks[-1]
    assert last["choices"] == []
    assert last["usage"]["prompt_tokens_details"] == {"cached_tokens": 4}
    assert last["usage"]["total_tokens"] == 10


def test_completion_stream_chunks(api: Served, worker: FakeWorker) -> None:
    with api.client() as c:
        r = c.post(COMPLETIONS, json={"model": MODEL, "prompt": "Once", "stream": True})
    data = sse_data(r)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert {ch["object"] for ch in chunks} == {"text_completion"}
    assert "".join(ch["choices"][0]["text"] for ch in chunks) == "Hello, world"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_stream_sends_text_the_deltas_held_back(api: Served, worker: FakeWorker) -> None:
    with api.client() as c:
        r = c.post(CHAT, json=chat("LAG", stream=True))
    chunks = [json.loads(d) for d in sse_data(r)[:-1]]
    assert "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks) == "café"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("stream", [False, True])
def test_failure_before_first_token_is_a_json_error(api: Served, worker: FakeWorker, stream: bool) -> None:
    with api.client() as c:
        r = c.post(CHAT, json=chat("TOO_LONG", stream=stream))
    assert r.status_code == 400
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {
        "error": {
            "message": "prompt is too long",
            "type": "invalid_request_error",
            "param": "messages",
            "code": None,
        }
    }


def test_worker_side_unknown_model_is_404(api: Served, worker: FakeWorker) -> None:
    with api.client() as c:
        r = c.post(CHAT, json=chat("NO_MODEL", stream=True))
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_worker_crash_is_500_and_the_job_failed(api: Served, worker: FakeWorker) -> None:
    with api.client() as c:
        r = c.post(CHAT, json=chat("CRASH"))
        assert r.status_code == 500
        assert r.json()["error"]["type"] == "server_error"
        job = c.get(f"/v1/jobs/{r.headers[JOB_ID_HEADER]}").json()
    assert job["status"] == "failed"
    assert job["error"]["message"] == "RuntimeError: boom" and job["result"] is None


def test_failure_mid_stream_is_an_error_chunk(api: Served, worker: FakeWorker) -> None:
    with api.client() as c:
        r = c.post(CHAT, json=chat("CRASH_LATER", stream=True))
    assert r.status_code == 200
    data = sse_data(r)
    assert data[-1] == "[DONE]"
    assert json.loads(data[-2])["error"]["type"] == "server_error"


def test_job_that_dies_silently_is_500(
    api: Served, worker: FakeWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(api.app.state.ctx.jobs, "state_poll_s", 0.2)
    with api.client() as c:
        r = c.post(CHAT, json=chat("VANISH"))
    assert r.status_code == 500
    assert "worker lost" in r.json()["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_timeout_is_504_and_cancels_the_job(
    serve: Any, rds: redis.Redis, worker: FakeWorker, stream: bool
) -> None:
    api = serve(job_timeout_s=0.6)
    with api.client() as c:
        started = time.monotonic()
        r = c.post(CHAT, json=chat("SILENT", stream=stream))
    assert time.monotonic() - started < 5
    assert r.status_code == 504
    assert r.json()["error"]["code"] == "timeout"
    assert rds.exists(keys.job_cancel(r.headers[JOB_ID_HEADER]))


def test_session_id_from_header_or_body(api: Served, worker: FakeWorker) -> None:
    with api.client() as c:
        c.post(CHAT, json=chat("hi"), headers={"X-Session-Id": "from-header"})
        c.post(CHAT, json=chat("hi", session_id="from-body"), headers={"X-Session-Id": "from-header"})
        c.post(CHAT, json=chat("hi"))
    assert [s.job.session_id for s in worker.seen] == ["from-header", "from-body", None]


def test_models_list(api: Served) -> None:
    with api.client() as c:
        listing = c.get("/v1/models").json()
        one = c.get(f"/v1/models/{MODEL}")
        missing = c.get("/v1/models/gpt-4")
    assert listing["object"] == "list"
    assert [m["id"] for m in listing["data"]] == [MODEL]
    assert listing["data"][0]["object"] == "model"
    assert one.json()["id"] == MODEL
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def wait_until(check: Any, timeout_s: float = 5) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_client_leaving_a_stream_cancels_its_job(api: Served, worker: FakeWorker, rds: redis.Redis) -> None:
    with api.client() as c, c.stream("POST", CHAT, json=chat("SLOW", stream=True)) as r:
        job_id = r.headers[JOB_ID_HEADER]
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
    assert wait_until(lambda: rds.exists(keys.job_cancel(job_id)))


def test_client_leaving_a_request_cancels_its_job(api: Served, worker: FakeWorker, rds: redis.Redis) -> None:
    with api.client() as c, pytest.raises(httpx.ReadTimeout):
        c.post(CHAT, json=chat("SLOW"), timeout=0.5)
    assert wait_until(lambda: len(worker.seen) == 1)
    assert wait_until(lambda: rds.exists(keys.job_cancel(worker.seen[0].job_id)))


def test_redis_lost_mid_stream_is_an_error_chunk(
    api: Served, worker: FakeWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from broker.messages import TokenDelta

    async def follow(*args: Any, **kwargs: Any) -> Any:
        yield TokenDelta("Hel", (1,))
        raise redis.ConnectionError("Redis went away")

    monkeypatch.setattr(api.app.state.ctx.jobs, "follow", follow)
    with api.client() as c:
        r = c.post(CHAT, json=chat("hi", stream=True))
    data = sse_data(r)  # a whole body, not a connection cut mid-way
    assert data[-1] == "[DONE]"
    assert json.loads(data[-2])["error"]["type"] == "service_unavailable_error"
