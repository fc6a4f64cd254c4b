"""The Batch and Files routes' edges against the served api and a real redis-server: a running
batch's input file cannot be deleted (409 file_in_use, OpenAI's error shape) until the batch
ends; a crafted id is a 404, never a read of another key (a 500 once)."""

from __future__ import annotations

import io
import json
import time

import openai
import pytest
import redis

from broker import keys
from tests.api.conftest import Served

MODEL = "smollm2"


def client(api: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api.url}/v1", api_key="none", max_retries=0, timeout=30)


def _upload(c: openai.OpenAI) -> str:
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 3}
    text = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": body}) + "\n"
    return c.files.create(file=("in.jsonl", io.BytesIO(text.encode())), purpose="batch").id


def test_a_running_batchs_input_cannot_be_deleted_until_it_ends(api: Served, rds: redis.Redis) -> None:
    c = client(api)
    file_id = _upload(c)
    batch = c.batches.create(input_file_id=file_id, endpoint="/v1/completions", completion_window="24h")
    with pytest.raises(openai.ConflictError) as refused:
        c.files.delete(file_id)
    error = refused.value.response.json()["error"]
    assert refused.value.status_code == 409
    assert (error["type"], error["code"]) == ("invalid_request_error", "file_in_use")
    assert error["param"] == "file_id"
    assert batch.id in error["message"]
    assert c.files.retrieve(file_id).id == file_id, "still there"
    c.batches.cancel(batch.id)
    deadline = time.monotonic() + 15
    while c.batches.retrieve(batch.id).status != "cancelled":  # the served api's runner ends it
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert c.files.delete(file_id).deleted
    assert not rds.exists(keys.file_readers(file_id))


def test_crafted_ids_are_404s(api: Served, rds: redis.Redis) -> None:
    c = client(api)
    batch = c.batches.create(input_file_id=_upload(c), endpoint="/v1/completions", completion_window="24h")
    rds.hset(keys.batch_running(batch.id), "1", '{"offset": 0, "jobs": [], "fed_at": 0}')
    with api.client() as h:
        for method, path in (
            ("GET", f"/v1/batches/{batch.id}:running"),
            ("POST", f"/v1/batches/{batch.id}:running/cancel"),
            ("GET", "/v1/files/file-x:readers"),
            ("GET", "/v1/files/file-x:readers/content"),
            ("DELETE", "/v1/files/file-x:readers"),
            ("GET", "/v1/jobs/x:meta"),
            ("DELETE", "/v1/jobs/x:meta"),
        ):
            r = h.request(method, path)
            assert r.status_code == 404, (method, path, r.text)
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        body = {"input_file_id": "file-x:record", "endpoint": "/v1/completions", "completion_window": "24h"}
        created = h.post("/v1/batches", json=body)
        assert created.status_code == 404, created.text
