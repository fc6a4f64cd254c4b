"""POST/GET/DELETE /v1/jobs: the lifecycle, cancellation and 404s."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
import redis

from broker import keys
from tests.api.conftest import MODEL, Served
from tests.api.fake_worker import WORKER, FakeWorker

FINAL = {"succeeded", "failed", "cancelled"}


def submit(c: httpx.Client, content: str, endpoint: str = "/v1/chat/completions", **extra: Any) -> str:
    body: dict[str, Any] = (
        {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}
        if endpoint == "/v1/chat/completions"
        else {"model": MODEL, "prompt": content, **extra}
    )
    r = c.post("/v1/jobs", json={"endpoint": endpoint, "body": body})
    assert r.status_code == 202, r.text
    return str(r.json()["id"])


def wait_for(c: httpx.Client, job_id: str, statuses: set[str], timeout_s: float = 10) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        job: dict[str, Any] = c.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in statuses or time.monotonic() > deadline:
            return job
        time.sleep(0.05)


def test_submit_answers_at_once_then_succeeds(api: Served, worker: FakeWorker, rds: redis.Redis) -> None:
    with api.client() as c:
        r = c.post(
            "/v1/jobs",
            json={"endpoint": "/v1/completions", "body": {"model": MODEL, "prompt": "Once", "stream": True}},
        )
        assert r.status_code == 202
        accepted = r.json()
        assert accepted["object"] == "job" and accepted["status"] == "queued"
        assert accepted["queue"] == keys.SHARED_QUEUE
        assert isinstance(accepted["created"], int)
        assert rds.ttl(keys.job_meta(accepted["id"])) > 0
        job = wait_for(c, accepted["id"], FINAL)
    assert job["status"] == "succeeded"
    assert job["route"] == {"queue": keys.SHARED_QUEUE, "reason": "shared: no live worker"}
    assert job["worker"] == WORKER and job["error"] is None
    assert job["result"]["object"] == "text_completion"
    assert job["result"]["id"] == f"cmpl-{accepted['id']}"
    assert job["result"]["choices"][0]["text"] == "Hello, world"
    assert job["usage"]["prompt_tokens_details"]["cached_tokens"] == 4


def test_queued_then_cancelled_before_it_ran(
    api: Served, worker: FakeWorker, rds: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker.pause()
    with api.client() as c:
        job_id = submit(c, "hi")
        job = c.get(f"/v1/jobs/{job_id}").json()
        assert job["status"] == "queued" and job["worker"] is None and job["result"] is None
        cancelled = c.delete(f"/v1/jobs/{job_id}")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelling"
        # never sent again: its message copy and pending entry went with the cancel
        assert not rds.exists(keys.job_message(job_id)) and rds.zscore(keys.PENDING_JOBS, job_id) is None
        worker.resume()  # it takes the message, finds the job revoked
        job = wait_for(c, job_id, FINAL)
    assert job["status"] == "cancelled"


def test_cancel_a_running_job(api: Served, worker: FakeWorker) -> None:
    with api.client() as c:
        job_id = submit(c, "SLOW")
        running = wait_for(c, job_id, {"running"})
        assert running["status"] == "running" and running["worker"] == WORKER
        assert c.delete(f"/v1/jobs/{job_id}").json()["status"] in {"cancelling", "cancelled"}
        job = wait_for(c, job_id, FINAL)
    assert job["status"] == "cancelled"
    assert job["result"]["choices"][0]["finish_reason"] == "abort"
    assert 0 < len(job["result"]["choices"][0]["message"]["content"]) < 400


def test_cancel_a_finished_job_changes_nothing(api: Served, worker: FakeWorker, rds: redis.Redis) -> None:
    with api.client() as c:
        job_id = submit(c, "hi")
        wait_for(c, job_id, FINAL)
        assert c.delete(f"/v1/jobs/{job_id}").json()["status"] == "succeeded"
    assert not rds.exists(keys.job_cancel(job_id))


def test_failed_job_carries_its_error(api: Served, worker: FakeWorker) -> None:
    with api.client() as c:
        job = wait_for(c, submit(c, "TOO_LONG"), FINAL)
    assert job["status"] == "failed"
    assert job["error"] == {
        "message": "prompt is too long",
        "type": "invalid_request_error",
        "param": "messages",
        "code": None,
    }


def test_a_waiting_request_sees_a_revoked_job_as_aborted(
    api: Served, worker: FakeWorker, monkeypatch: pytest.MonkeyPatch, rds: redis.Redis
) -> None:
    """A job cancelled (and revoked) before any worker ran it ends a waiting request too."""
    monkeypatch.setattr(api.app.state.ctx.jobs, "state_poll_s", 0.2)
    worker.pause()
    with api.client() as c:
        answers: list[httpx.Response] = []
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        t = threading.Thread(target=lambda: answers.append(c.post("/v1/chat/completions", json=body)))
        t.start()
        deadline = time.monotonic() + 5
        while not rds.keys("kvferry:job:*:meta") and time.monotonic() < deadline:
            time.sleep(0.02)
        (key,) = rds.keys("kvferry:job:*:meta")
        job_id = (key.decode() if isinstance(key, bytes) else key).split(":")[2]
        c.delete(f"/v1/jobs/{job_id}")
        worker.resume()
        t.join(10)
    (r,) = answers
    assert r.status_code == 200
    assert r.json()["choices"][0]["finish_reason"] == "abort"


def test_unknown_jobs_are_404(api: Served) -> None:
    with api.client() as c:
        for r in (c.get("/v1/jobs/nope"), c.delete("/v1/jobs/nope")):
            assert r.status_code == 404
            assert r.json()["error"]["code"] == "job_not_found"


@pytest.mark.parametrize(
    ("doc", "param"),
    [
        ({"endpoint": "/v1/embeddings", "body": {}}, "endpoint"),
        ({"body": {"model": MODEL, "prompt": "x"}}, "endpoint"),
        ({"endpoint": "/v1/completions"}, "body"),
        ({"endpoint": "/v1/completions", "body": {"model": MODEL}}, "prompt"),
        ([1, 2], "body"),
    ],
)
def test_bad_job_submissions_are_400(api: Served, doc: Any, param: str) -> None:
    with api.client() as c:
        r = c.post("/v1/jobs", json=doc)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == param


def test_unknown_model_job_is_404(api: Served) -> None:
    with api.client() as c:
        r = c.post("/v1/jobs", json={"endpoint": "/v1/completions", "body": {"model": "x", "prompt": "y"}})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
