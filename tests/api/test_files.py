"""The Files API through the official openai client against the real api (uvicorn, redis-server):
create, retrieve, list, content, delete; tenant scoping (another tenant's file is a 404); the
upload limits, enforced while the body streams in (an over-limit upload is refused without the
rest of it being read, and leaves no file); a bad purpose is a 400 that names it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
import redis

from broker import keys
from tests.api.conftest import Served

PAIRS = (("sk-alice", "alice"), ("sk-bob", "bob"))
MAX_BYTES = 1024 * 1024
MAX_LINES = 20
LINE = {"custom_id": "r-0", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}


@pytest.fixture(scope="module")
def files_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("files")


@pytest.fixture
def api(serve: Callable[..., Served], rds: redis.Redis, files_dir: Path) -> Served:
    """The api with two tenants and small limits; its store emptied (as Redis is) for each test."""
    for leftover in files_dir.rglob("*"):
        if leftover.is_file():
            leftover.unlink()
    return serve(api_keys=PAIRS, files_dir=files_dir, files_max_bytes=MAX_BYTES, files_max_lines=MAX_LINES)


def client(api: Served, key: str = "sk-alice") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api.url}/v1", api_key=key, max_retries=0, timeout=30)


def jsonl(n: int) -> bytes:
    return b"".join(json.dumps({**LINE, "custom_id": f"r-{i}"}).encode() + b"\n" for i in range(n))


def stored(files_dir: Path) -> list[str]:
    """The store's files, in-progress uploads included."""
    return sorted(p.name for p in files_dir.rglob("*") if p.is_file())


def test_create_retrieve_list_content_delete(api: Served, files_dir: Path) -> None:
    alice = client(api)
    data = jsonl(3)
    made = alice.files.create(file=("requests.jsonl", data), purpose="batch")
    assert made.object == "file" and made.id.startswith("file-")
    assert (made.bytes, made.filename, made.purpose) == (len(data), "requests.jsonl", "batch")
    assert made.status == "processed"
    assert alice.files.retrieve(made.id) == made
    assert alice.files.content(made.id).read() == data
    other = alice.files.create(file=("notes.txt", b"not jsonl at all"), purpose="user_data")
    listed = alice.files.list()
    assert [f.id for f in listed.data] == [other.id, made.id]  # newest first
    assert [f.id for f in alice.files.list(purpose="batch").data] == [made.id]
    page = alice.files.list(limit=1, order="asc")
    assert [f.id for f in page.data] == [made.id] and page.has_more
    assert [f.id for f in alice.files.list(limit=1)] == [other.id, made.id]  # auto-paging: after=
    gone = alice.files.delete(made.id)
    assert (gone.id, gone.object, gone.deleted) == (made.id, "file", True)
    with pytest.raises(openai.NotFoundError):
        alice.files.retrieve(made.id)
    assert stored(files_dir) == [other.id]


def test_another_tenants_file_is_not_found(api: Served, rds: redis.Redis) -> None:
    alice, bob = client(api), client(api, "sk-bob")
    made = alice.files.create(file=("a.jsonl", jsonl(1)), purpose="batch")
    for call in (bob.files.retrieve, bob.files.content, bob.files.delete):
        with pytest.raises(openai.NotFoundError) as caught:
            call(made.id)
        error = caught.value.body
        assert isinstance(error, dict) and error["type"] == "invalid_request_error"
        assert made.id in error["message"]
    assert bob.files.list().data == []
    assert alice.files.retrieve(made.id).id == made.id  # still there
    assert rds.exists(keys.file_record(made.id))


def test_bad_purpose_is_a_400_naming_it(api: Served, files_dir: Path) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client(api).files.create(file=("a.jsonl", jsonl(1)), purpose="fine-tune")
    assert "'fine-tune'" in caught.value.message and caught.value.param == "purpose"
    assert stored(files_dir) == []


def test_too_many_lines_for_a_batch_is_a_400(api: Served, files_dir: Path) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client(api).files.create(file=("a.jsonl", jsonl(MAX_LINES + 1)), purpose="batch")
    assert caught.value.code == "too_many_lines"
    assert client(api).files.create(file=("a.jsonl", jsonl(MAX_LINES) + b"\n\n"), purpose="batch").bytes > 0
    made = client(api).files.create(file=("a.txt", jsonl(MAX_LINES + 1)), purpose="user_data")
    assert made.purpose == "user_data"  # the line cap is the batch files'
    with pytest.raises(openai.BadRequestError) as caught:
        client(api).files.create(file=("a.jsonl", b"\xff\xfe\n"), purpose="batch")
    assert caught.value.code == "invalid_file_format"
    assert len(stored(files_dir)) == 2


def test_declared_length_over_the_limit_is_refused_before_reading(api: Served, files_dir: Path) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        client(api).files.create(file=("big.jsonl", b"x" * (2 * MAX_BYTES)), purpose="user_data")
    assert caught.value.status_code == 413
    assert stored(files_dir) == []


@pytest.mark.parametrize(
    ("purpose", "chunk", "status", "code"),
    [
        ("user_data", b"y" * 65536, 413, "file_too_large"),  # past the byte limit
        ("batch", b"{}\n" * 4096, 400, "too_many_lines"),  # past the line limit, far below the byte one
    ],
)
def test_over_limit_upload_streamed_is_refused_without_reading_it_all(
    api: Served, files_dir: Path, rds: redis.Redis, purpose: str, chunk: bytes, status: int, code: str
) -> None:
    """A chunked body (no Content-Length) from a slow sender: the api refuses it once the file
    passes a limit, drops the partial file, and the sender is not drained to its end."""
    boundary = "kvferry-test-boundary"
    total = 8 * MAX_BYTES
    sent = 0

    def body() -> Iterator[bytes]:
        nonlocal sent
        head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n{purpose}\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        yield head
        while sent < total:
            sent += len(chunk)
            yield chunk
            time.sleep(0.005)
        yield f"\r\n--{boundary}--\r\n".encode()

    headers = {
        "authorization": "Bearer sk-alice",
        "content-type": f"multipart/form-data; boundary={boundary}",
    }
    try:
        with httpx.Client(base_url=api.url, timeout=30) as http:
            response = http.post("/v1/files", content=body(), headers=headers)
        assert response.status_code == status
        assert response.json()["error"]["code"] == code
    except httpx.TransportError:
        pass  # the api closed the connection on a sender still writing: refused all the same
    assert sent < total / 2, f"the sender was drained: {sent} of {total} bytes"
    assert stored(files_dir) == []
    assert rds.zcard(keys.tenant_files("alice")) == 0


def test_an_upload_cut_short_leaves_nothing(api: Served, files_dir: Path) -> None:
    boundary = "kvferry-test-boundary"

    def body() -> Iterator[bytes]:
        yield (
            f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nuser_data\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="cut"\r\n\r\n'
        ).encode()
        yield b"z" * 65536
        deadline = time.monotonic() + 10
        while not stored(files_dir):  # the api has begun writing the upload
            assert time.monotonic() < deadline, "the upload never reached the store"
            time.sleep(0.01)
        raise ConnectionAbortedError("the client gives up")

    headers = {
        "authorization": "Bearer sk-alice",
        "content-type": f"multipart/form-data; boundary={boundary}",
    }
    with pytest.raises(ConnectionAbortedError), httpx.Client(base_url=api.url, timeout=30) as http:
        http.post("/v1/files", content=body(), headers=headers)
    deadline = time.monotonic() + 10
    while stored(files_dir):
        assert time.monotonic() < deadline, f"a partial upload stayed: {stored(files_dir)}"
        time.sleep(0.01)
    assert client(api).files.list().data == []


def test_settings_reach_the_api_config(tmp_path: Path) -> None:
    from ops.settings import Settings
    from ops.stack.api_server import api_config

    default = api_config(Settings.from_env({"KVFERRY_CACHE_DIR": str(tmp_path)}))
    assert default.files_dir == tmp_path / "files"
    assert (default.files_max_bytes, default.files_max_lines) == (200 * 1024 * 1024, 50000)
    env = {"KVFERRY_FILES_DIR": str(tmp_path / "shared"), "KVFERRY_FILES_MAX_BYTES": "1M"}
    config = api_config(Settings.from_env({**env, "KVFERRY_FILES_MAX_LINES": "7"}))
    assert config.files_dir == tmp_path / "shared"
    assert (config.files_max_bytes, config.files_max_lines) == (2**20, 7)
