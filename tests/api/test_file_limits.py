"""Upload form limits against the real api (uvicorn, redis-server), with chunked bodies (no
Content-Length to refuse up front): the form's fields are bounded in names, number and bytes, and
the whole body is bounded while it streams; each refusal comes before the sender is drained, in
OpenAI's error shape naming the limit, and leaves no file."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis

from broker import keys
from tests.api.conftest import Served
from tests.api.test_files import MAX_BYTES, MAX_LINES, PAIRS, stored

BOUNDARY = "kvferry-limit-boundary"
TOTAL = 8 * MAX_BYTES  # what each sender would send in all


@pytest.fixture
def api(serve: Callable[..., Served], rds: redis.Redis, tmp_path: Path) -> Served:
    return serve(api_keys=PAIRS, files_dir=tmp_path, files_max_bytes=MAX_BYTES, files_max_lines=MAX_LINES)


def field(name: str, value: bytes) -> bytes:
    return f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode() + value + b"\r\n"


def file_part(data: bytes) -> bytes:
    head = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="f"\r\n\r\n'
    return head.encode() + data + f"\r\n--{BOUNDARY}--\r\n".encode()


def post_chunked(api: Served, pieces: Iterator[bytes]) -> tuple[httpx.Response | None, int]:
    """POST /v1/files with a chunked body from a slow sender: (the answer, or None when the api
    closed the connection on a sender still writing; the bytes sent)."""
    sent = 0

    def body() -> Iterator[bytes]:
        nonlocal sent
        for piece in pieces:
            sent += len(piece)
            yield piece
            time.sleep(0.002)

    headers = {
        "authorization": "Bearer sk-alice",
        "content-type": f"multipart/form-data; boundary={BOUNDARY}",
    }
    try:
        with httpx.Client(base_url=api.url, timeout=30) as http:
            return http.post("/v1/files", content=body(), headers=headers), sent
    except httpx.TransportError:
        return None, sent


def refused(api: Served, pieces: Iterator[bytes], status: int, *named: str) -> None:
    response, sent = post_chunked(api, pieces)
    if response is not None:
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        for word in named:
            assert word in error["message"], error
    assert sent < TOTAL / 2, f"the sender was drained: {sent} of {TOTAL} bytes"


def many_fields() -> Iterator[bytes]:
    """What held 120 MB in the api's memory before: field after field, each under the per-field cap."""
    yield field("purpose", b"user_data")
    n = 0
    while n * 4000 < TOTAL:
        yield field(f"x{n}", b"v" * 4000)
        n += 1
    yield file_part(b"small")


def repeated_field() -> Iterator[bytes]:
    chunk = field("purpose", b"user_data") * 500
    n = 0
    while n * len(chunk) < TOTAL:
        yield chunk
        n += 1
    yield file_part(b"small")


def junk_after_the_form() -> Iterator[bytes]:
    """A whole, valid form, then an epilogue the parser skips: only the body's length bounds it."""
    yield field("purpose", b"user_data") + file_part(b"small")
    n = 0
    while n * 65536 < TOTAL:
        yield b"e" * 65536
        n += 1


def test_unknown_fields_are_refused_before_the_body_is_read(
    api: Served, tmp_path: Path, rds: redis.Redis
) -> None:
    refused(api, many_fields(), 400, "'x0'", "purpose")
    assert stored(tmp_path) == [] and rds.zcard(keys.tenant_files("alice")) == 0


def test_a_field_given_twice_is_refused(api: Served, tmp_path: Path) -> None:
    refused(api, repeated_field(), 400, "'purpose'", "twice")
    assert stored(tmp_path) == []


def test_fields_are_capped_in_total_bytes(api: Served, tmp_path: Path) -> None:
    pieces = [field("expires_after[anchor]", b"a" * 4096), field("expires_after[seconds]", b"1" * 4096)]
    pieces += [field("purpose", b"user_data"), file_part(b"small")]
    refused(api, iter(pieces), 413, "8192 bytes")
    assert stored(tmp_path) == []


def test_a_chunked_body_past_the_limit_is_refused_while_it_streams(api: Served, tmp_path: Path) -> None:
    refused(api, junk_after_the_form(), 413, str(MAX_BYTES + 64 * 1024), "bytes")
    assert stored(tmp_path) == []


def test_a_chunked_body_within_the_limits_is_stored(api: Served, tmp_path: Path) -> None:
    pieces = [field("purpose", b"user_data"), field("expires_after[anchor]", b"created_at")]
    pieces += [field("expires_after[seconds]", b"3600"), file_part(b"x" * (MAX_BYTES - 10))]
    response, _ = post_chunked(api, iter(pieces))
    assert response is not None and response.status_code == 200, response and response.text
    made = response.json()
    assert made["bytes"] == MAX_BYTES - 10 and made["expires_at"] == made["created_at"] + 3600
    assert stored(tmp_path) == [made["id"]]
