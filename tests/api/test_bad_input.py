"""The odd inputs of issue 8: each is a 400 with an OpenAI error body naming the field, and a
request rejected with 400 leaves nothing in Redis."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from tests.api.conftest import MODEL, Served, request_keys
from tests.api.fake_worker import FakeWorker
from tests.api.test_errors import assert_error

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
MSGS = [{"role": "user", "content": "hi"}]


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": MSGS, **extra}


def text(prompt: Any, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, **extra}


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def raw(doc: Any) -> bytes:
    return json.dumps(doc).encode()  # ensure_ascii: a lone surrogate travels as a \ud800 escape


DEEP = b'{"model": "smollm2", "messages": ' + b"[" * 3000 + b"]" * 3000 + b"}"
JUST_TOO_DEEP = b'{"model": "smollm2", "x": ' + b"[" * 64 + b"]" * 64 + b"}"

CASES: list[tuple[str, str, bytes, str]] = [
    ("seed 2**64", CHAT, raw(chat(seed=2**64)), "seed"),
    ("seed -1", CHAT, raw(chat(seed=-1)), "seed"),
    ("temperature 1e-300", CHAT, raw(chat(temperature=1e-300)), "temperature"),
    ("temperature as a string", CHAT, raw(chat(temperature="0.5")), "temperature"),
    ("temperature NaN", CHAT, b'{"model": "smollm2", "messages": [], "temperature": NaN}', "body"),
    ("temperature Infinity", CHAT, raw(chat()).replace(b"}", b', "temperature": Infinity}'), "body"),
    ("token id 2**63", TEXT, raw(text([1, 2**63])), "prompt"),
    ("token id -1", TEXT, raw(text([-1])), "prompt"),
    ("token id true", TEXT, raw(text([True])), "prompt"),
    ("empty token list in a batch", TEXT, raw(text([[]])), "prompt"),
    ("JSON 3000 deep", CHAT, DEEP, "body"),
    ("JSON 65 deep", CHAT, JUST_TOO_DEEP, "body"),
    ("lone surrogate in session_id", CHAT, raw(chat(session_id="ab\ud800")), "body"),
    ("lone surrogate in the prompt", TEXT, raw(text("x\udfff")), "body"),
    ("lone surrogate in a message", CHAT, raw(chat(messages=[user("\ud83d")])), "body"),
    ("lone surrogate in a key", CHAT, raw({**chat(), "\ud800": 1}), "body"),
    ("invalid UTF-8", CHAT, raw(chat(messages=[user("x")])).replace(b"x", b"\xff"), "body"),
    ('ignore_eos "false"', CHAT, raw(chat(ignore_eos="false")), "ignore_eos"),
    ('stream "false"', CHAT, raw(chat(stream="false")), "stream"),
    ("include_usage 1", CHAT, raw(chat(stream=True, stream_options={"include_usage": 1})), "stream_options"),
    ("session id with /", CHAT, raw(chat(session_id="a/b")), "session_id"),
    ("session id empty", CHAT, raw(chat(session_id="")), "session_id"),
    ("session id 129 chars", CHAT, raw(chat(session_id="s" * 129)), "session_id"),
    ("cache_salt with a space", CHAT, raw(chat(cache_salt="a b")), "cache_salt"),
    ("top_p 0", CHAT, raw(chat(top_p=0)), "top_p"),
    ("top_p 1.5", CHAT, raw(chat(top_p=1.5)), "top_p"),
    ("top_k -2", CHAT, raw(chat(top_k=-2)), "top_k"),
    ("max_tokens 2**40", CHAT, raw(chat(max_tokens=2**40)), "max_tokens"),
    ("max_tokens 1.0", CHAT, raw(chat(max_tokens=1.0)), "max_tokens"),
    ("max_completion_tokens 0", CHAT, raw(chat(max_completion_tokens=0)), "max_completion_tokens"),
    ("five stop strings", CHAT, raw(chat(stop=["a", "b", "c", "d", "e"])), "stop"),
    ("an empty stop string", CHAT, raw(chat(stop=[""])), "stop"),
    ("n over 64", CHAT, raw(chat(n=65)), "n"),
    ("frequency_penalty 3", CHAT, raw(chat(frequency_penalty=3)), "frequency_penalty"),
    ("an image part", CHAT, raw(chat(messages=[user([{"type": "image_url"}])])), "messages"),
    ("model empty", CHAT, raw(chat(model="")), "model"),
    ("body a list", CHAT, raw([1]), "body"),
]


@pytest.mark.parametrize(("path", "body", "param"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_odd_inputs_are_400_and_leave_nothing(
    api: Served, rds: redis.Redis, path: str, body: bytes, param: str
) -> None:
    before = len(request_keys(rds))
    with api.client() as c:
        r = c.post(path, content=body, headers={"content-type": "application/json"})
        jobs = c.post("/v1/jobs", content=b'{"endpoint": "%s", "body": ' % path.encode() + body + b"}")
    error = assert_error(r, 400, param)
    assert error["type"] == "invalid_request_error"
    assert_error(jobs, 400)
    left = request_keys(rds)
    assert not left and before == 0, left


def test_session_header_is_held_to_the_charset(api: Served, rds: redis.Redis) -> None:
    with api.client() as c:
        assert_error(c.post(CHAT, json=chat(), headers={"X-Session-Id": "a/b"}), 400, "session_id")
    assert request_keys(rds) == []


def test_accepted_edges(api: Served, worker: FakeWorker) -> None:
    """The bounds themselves are fine, and so are the allow-listed no-op fields."""
    cases = [
        (CHAT, chat(seed=2**64 - 1, temperature=0.01, top_k=-1, top_p=1, session_id="a.b:c-d_1")),
        (CHAT, chat(user="u", store=False, service_tier="auto")),
        (CHAT, chat(cache_salt="salt-1", stop="x", max_completion_tokens=5, temperature=0)),
        (TEXT, text([[0, 2**31 - 1]], stop=["a", "b", "c", "d"])),
        (TEXT, text(["one prompt"], metadata={"k": "v"})),
    ]
    with api.client() as c:
        for path, body in cases:
            r = c.post(path, json=body)
            assert r.status_code == 200, (body, r.text)
    jobs = [s.job for s in worker.seen]
    assert jobs[0].params.seed == 2**64 - 1 and jobs[0].params.top_k == -1
    assert jobs[1].params.max_tokens is None  # the worker applies its default, capped by the context
    assert jobs[2].cache_salt == "salt-1" and jobs[2].params.max_tokens == 5
    assert jobs[3].prompt_token_ids == (0, 2**31 - 1)
