"""Bad input: every case answers its status code with an OpenAI error body, and queues nothing."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from fastapi.testclient import TestClient
from kombu.exceptions import OperationalError
from redis.exceptions import ConnectionError as RedisConnectionError

from api.app import create_app
from api.config import ApiConfig
from api.jobs import client as job_client
from broker import keys, priority
from broker.errors import CodecError
from broker.jobs import events as job_events
from tests.api.conftest import MODEL, Served

CHAT = "/v1/chat/completions"
MSGS = [{"role": "user", "content": "hi"}]


def _depth(rds: redis.Redis) -> int:
    """Messages on the shared queue, every priority band's list (broker/priority.py)."""
    return sum(int(rds.llen(key)) for key in priority.queue_keys(keys.SHARED_QUEUE))


def assert_error(r: Any, status: int, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    error: dict[str, Any] = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    return error


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        (CHAT, {"messages": MSGS}, 400, "model"),
        (CHAT, {"model": MODEL}, 400, "messages"),
        (CHAT, {"model": MODEL, "messages": []}, 400, "messages"),
        (CHAT, {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages"),
        (CHAT, {"model": MODEL, "messages": MSGS, "max_tokens": -1}, 400, "max_tokens"),
        (CHAT, {"model": MODEL, "messages": MSGS, "max_tokens": 0}, 400, "max_tokens"),
        (CHAT, {"model": MODEL, "messages": MSGS, "max_tokens": "many"}, 400, "max_tokens"),
        (CHAT, {"model": MODEL, "messages": MSGS, "temperature": -1}, 400, "temperature"),
        (CHAT, {"model": MODEL, "messages": MSGS, "n": 65}, 400, "n"),
        (CHAT, {"model": MODEL, "messages": MSGS, "stream": "yes"}, 400, "stream"),
        (CHAT, {"model": MODEL, "messages": MSGS, "stream_options": 1}, 400, "stream_options"),
        (CHAT, {"model": MODEL, "messages": MSGS, "session_id": 7}, 400, "session_id"),
        (CHAT, [1, 2, 3], 400, "body"),
        ("/v1/completions", {"model": MODEL}, 400, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": ""}, 400, "prompt"),
    ],
)
def test_invalid_bodies_are_400(
    api: Served, rds: redis.Redis, path: str, body: Any, status: int, param: str
) -> None:
    with api.client() as c:
        error = assert_error(c.post(path, json=body), status, param)
    assert error["type"] == "invalid_request_error"
    assert _depth(rds) == 0 and not rds.keys("kvferry:job:*")


def test_invalid_json_is_400(api: Served) -> None:
    with api.client() as c:
        r = c.post(CHAT, content=b"{not json", headers={"content-type": "application/json"})
    assert_error(r, 400, "body")


def test_unknown_model_is_404(api: Served, rds: redis.Redis) -> None:
    with api.client() as c:
        error = assert_error(
            c.post(CHAT, json={"model": "gpt-4", "messages": MSGS}), 404, "model", "model_not_found"
        )
    assert "gpt-4" in error["message"]
    assert not rds.keys("kvferry:job:*")


def test_body_too_large_is_413(serve: Any, rds: redis.Redis) -> None:
    api = serve(max_body_bytes=1024)
    big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 2000}]}
    with api.client() as c:
        assert_error(c.post(CHAT, json=big), 413)

        def chunks() -> Iterator[bytes]:  # no content-length: counted as it arrives
            yield b'{"model": "smollm2", "prompt": "'
            yield b"x" * 2000
            yield b'"}'

        assert_error(c.post("/v1/completions", content=chunks()), 413)
        small = c.post(
            "/v1/jobs", json={"endpoint": "/v1/completions", "body": {"model": MODEL, "prompt": "x"}}
        )
        assert small.status_code == 202


def test_broker_down_at_submit_is_503_and_leaves_nothing(
    api: Served, rds: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's record and its Celery message go in one transaction: a Redis that cannot be
    reached at submit answers 503, and neither a record nor a message is left behind."""
    jobs = api.app.state.ctx.jobs
    dead = aioredis.Redis.from_url("redis://127.0.0.1:1", socket_connect_timeout=1)
    submit = jobs.submit

    async def submit_to_a_dead_redis(*args: Any) -> None:  # admission and routing still reach it
        with monkeypatch.context() as m:
            m.setattr(jobs.redis, "pipeline", dead.pipeline)
            await submit(*args)

    monkeypatch.setattr(jobs, "submit", submit_to_a_dead_redis)
    with api.client() as c:
        for r in (
            c.post(CHAT, json={"model": MODEL, "messages": MSGS}),
            c.post("/v1/jobs", json={"endpoint": CHAT, "body": {"model": MODEL, "messages": MSGS}}),
        ):
            error = assert_error(r, 503)
            assert error["message"] == "the queue service is unavailable; try again later"
            assert "127.0.0.1" not in r.text  # the cause is logged, never sent
    assert not rds.keys("kvferry:job:*")
    assert _depth(rds) == 0


def test_unknown_route_and_method(api: Served) -> None:
    with api.client() as c:
        assert_error(c.get("/v1/nothing"), 404)
        assert_error(c.get(CHAT), 405)


def test_framework_validation_errors_are_400_not_422(redis_url: str) -> None:
    app = create_app(ApiConfig(redis_url=redis_url))

    @app.get("/probe")
    async def probe(n: int) -> dict[str, int]:
        return {"n": n}

    with TestClient(app) as c:
        assert_error(c.get("/probe", params={"n": "seven"}), 400, "query.n")


def test_config_validates_itself() -> None:
    bad: list[dict[str, Any]] = [
        {"served_models": ()},
        {"job_timeout_s": 0},
        {"api_key": ""},
        {"tenant_max_jobs": -1},
        {"default_max_tokens": 0},
    ]
    for fields in bad:
        with pytest.raises(ValueError):
            ApiConfig(**fields)


def test_redis_down_is_503_naming_no_internal_host() -> None:
    """The body says the service is unavailable, never the Redis exception's text (its host and
    port, a Sentinel master's name): that is logged only."""
    from tests.api.conftest import free_port

    port = free_port()
    app = create_app(ApiConfig(redis_url=f"redis://127.0.0.1:{port}/0", served_models=(MODEL,)))
    with TestClient(app) as c:
        replies = [
            c.post(CHAT, json={"model": MODEL, "messages": MSGS}),
            c.get("/v1/jobs/00000000-0000-0000-0000-000000000000"),
            c.get("/metrics"),
        ]
        for r in replies:
            error = assert_error(r, 503)
            assert str(port) not in r.text and "127.0.0.1" not in r.text, r.text
            assert error["message"] == "the queue service is unavailable; try again later"


# Errors are classified by type: the queue service being down is a 503; a message of ours that
# does not decode is a bug (500, its cause logged), never "the queue service is unavailable".


def _queued_job_id(rds: redis.Redis, timeout_s: float = 10) -> str:
    """Take the job the api just queued off the shared queue (no worker runs here); its id."""
    popped = rds.brpop(priority.queue_keys(keys.SHARED_QUEUE), timeout=timeout_s)
    assert popped is not None, "the api queued nothing"
    job_id: str = json.loads(popped[1])["headers"]["id"]
    return job_id


def _post_in_thread(api: Served, body: dict[str, Any]) -> tuple[threading.Thread, list[Any]]:
    replies: list[Any] = []

    def post() -> None:
        with api.client() as c:
            replies.append(c.post(CHAT, json=body))

    thread = threading.Thread(target=post, daemon=True)
    thread.start()
    return thread, replies


def test_a_result_that_does_not_decode_is_500_and_logged(
    api: Served, rds: redis.Redis, celery_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    thread, replies = _post_in_thread(api, {"model": MODEL, "messages": MSGS})
    job_id = _queued_job_id(rds)
    # a worker of another version: a SUCCESS whose result is not a GenerateResult
    celery_client.backend.store_result(job_id, {"job_id": job_id, "tokens": "many"}, "SUCCESS")
    with caplog.at_level(logging.ERROR, logger="api.jobs.outcome"):
        thread.join(15)
    assert replies, "no answer"
    error = assert_error(replies[0], 500)
    assert error["type"] == "server_error" and "unreadable job result" in error["message"]
    logged = [r for r in caplog.records if r.name == "api.jobs.outcome" and job_id in r.getMessage()]
    assert logged and isinstance(logged[0].exc_info[1], CodecError)  # type: ignore[index]


@pytest.mark.parametrize("stream", [False, True])
def test_a_stream_event_that_does_not_decode_is_500_and_logged(
    api: Served, rds: redis.Redis, caplog: pytest.LogCaptureFixture, stream: bool
) -> None:
    thread, replies = _post_in_thread(api, {"model": MODEL, "messages": MSGS, "stream": stream})
    job_id = _queued_job_id(rds)
    # a non-streaming request waits on the job's end stream only; a streaming one follows the stream
    stream_key = keys.job_stream(job_id) if stream else keys.job_end(job_id)
    rds.xadd(stream_key, {job_events.EVENT_FIELD: b'{"event":"delta","text":7}'})
    with caplog.at_level(logging.ERROR, logger="api.errors"):
        thread.join(15)
    assert replies, "no answer"
    error = assert_error(replies[0], 500)
    assert error["type"] == "server_error"
    assert any(isinstance(r.exc_info[1], CodecError) for r in caplog.records if r.exc_info)


@pytest.mark.parametrize(
    ("raised", "status"),
    [
        (RedisConnectionError("Connection refused"), 503),
        (OperationalError("broker connection lost"), 503),
        (CodecError("cannot encode GenerateJob"), 500),
        (RuntimeError("a plain bug"), 500),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v),
)
def test_send_failures_are_classified_by_type(
    api: Served, rds: redis.Redis, monkeypatch: pytest.MonkeyPatch, raised: Exception, status: int
) -> None:
    def broken_message(*args: Any) -> None:
        raise raised

    monkeypatch.setattr(job_client, "task_message", broken_message)
    with api.client() as c:
        error = assert_error(c.post(CHAT, json={"model": MODEL, "messages": MSGS}), status)
    assert error["type"] == ("service_unavailable_error" if status == 503 else "server_error")
    assert not rds.keys("kvferry:job:*")  # nothing of the job is kept either way
