"""vLLM's `priority` on the online endpoints and in a /v1/jobs body: accepted (no longer a 400
unsupported_parameter), bounded, carried on the job (class interactive), and it picks the band
list the job's message is queued in (broker/priority.py)."""

from __future__ import annotations

import json
import time

import pytest
import redis

from broker import keys, priority
from tests.api.conftest import MODEL, Served, request_keys
from tests.api.fake_worker import FakeWorker
from tests.api.test_errors import assert_error

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
MSGS = [{"role": "user", "content": "hi"}]


def test_priority_reaches_the_job(api: Served, worker: FakeWorker) -> None:
    with api.client() as c:
        assert c.post(CHAT, json={"model": MODEL, "messages": MSGS, "priority": -3}).status_code == 200
        assert c.post(TEXT, json={"model": MODEL, "prompt": "hi", "priority": 5}).status_code == 200
        assert c.post(TEXT, json={"model": MODEL, "prompt": "hi"}).status_code == 200
        body = {"model": MODEL, "messages": MSGS, "priority": 1}
        assert c.post("/v1/jobs", json={"endpoint": CHAT, "body": body}).status_code == 202
        deadline = time.monotonic() + 10
        while len(worker.seen) < 4 and time.monotonic() < deadline:  # the queued job
            time.sleep(0.02)
    got = sorted((s.job.priority, s.job.job_class, s.job.batch_id) for s in worker.seen)
    assert got == [
        (-3, "interactive", ""),
        (0, "interactive", ""),
        (1, "interactive", ""),
        (5, "interactive", ""),
    ]


@pytest.mark.parametrize(("value", "band"), [(0, 2), (-1, 1), (-(2**31 - 1), 0), (2**31 - 1, 4)])
def test_the_message_goes_to_its_band(api: Served, rds: redis.Redis, value: int, band: int) -> None:
    with api.client() as c:
        body = {"model": MODEL, "messages": MSGS, "priority": value}
        r = c.post("/v1/jobs", json={"endpoint": CHAT, "body": body})
        assert r.status_code == 202, r.text
    [key] = [k.decode() for k in rds.keys(f"{keys.SHARED_QUEUE}*")]
    assert key == priority.queue_key(keys.SHARED_QUEUE, band)
    message = json.loads(rds.lindex(key, 0))  # type: ignore[arg-type]
    assert message["properties"]["priority"] == band
    record = json.loads(rds.get(keys.job_delivery(r.json()["id"])))  # type: ignore[arg-type]
    assert record["queue"] == key  # the lost-message check watches the band's list


@pytest.mark.parametrize("value", [2**31, -(2**31), "1", 1.5, True])
def test_a_bad_priority_is_400(api: Served, rds: redis.Redis, value: object) -> None:
    with api.client() as c:
        r = c.post(CHAT, json={"model": MODEL, "messages": MSGS, "priority": value})
    assert_error(r, 400, "priority")
    assert request_keys(rds) == []
