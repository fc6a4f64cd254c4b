"""Cache-aware routing through the API, each decision visible in the job's metadata."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import httpx
import redis

from broker import keys
from tests.integration.conftest import MODEL, WorkerProcess, wait_for
from tests.integration.jobs import wait_settled
from tests.integration.test_sessions import _chat

Reference = Callable[[list[int], int], list[int]]
SYSTEM = "Routing test system prompt, long enough to span blocks. " * 5


def _ask(
    api_url: str, messages: list[dict[str, str]], session: str | None = None
) -> tuple[dict[str, Any], dict]:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": 6,
        "temperature": 0,
        "ignore_eos": True,
    }
    if session:
        body["session_id"] = session
    reply = httpx.post(f"{api_url}/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    job = httpx.get(f"{api_url}/v1/jobs/{reply.headers['x-job-id']}", timeout=30).json()
    return reply.json(), job


def _continued(api_url: str, session: str, reply: dict[str, Any], reference: Reference) -> list[int]:
    """HF's answer on the prompt ids the worker used (GET /v1/sessions shows them, then the
    output): a continued turn reuses the ids its last turn ended with (workers/jobs/prompt.py)."""
    view = httpx.get(f"{api_url}/v1/sessions/{session}", timeout=10).json()
    prompt = view["token_ids"][: reply["usage"]["prompt_tokens"]]
    return reference(prompt, reply["usage"]["completion_tokens"])


def test_session_affinity_and_prefix_match(
    api_url: str,
    redis_client: redis.Redis,
    two_workers: tuple[WorkerProcess, WorkerProcess],
    tokenizer: Any,
    tiny_reference: Reference,
) -> None:
    session = f"route-{uuid.uuid4().hex[:8]}"
    turn1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "first"}]
    reply1, job1 = _ask(api_url, turn1, session)
    first_worker = job1["worker"]
    turn2 = [
        *turn1,
        {"role": "assistant", "content": reply1["choices"][0]["message"]["content"]},
        {"role": "user", "content": "second"},
    ]
    reply2, job2 = _ask(api_url, turn2, session)
    assert job2["route"]["reason"] == f"session affinity: {first_worker}", job2["route"]
    assert job2["worker"] == first_worker
    assert reply2["usage"]["kv_sources"]["pool"] > 0
    assert (
        tokenizer.decode(_continued(api_url, session, reply2, tiny_reference))
        == reply2["choices"][0]["message"]["content"]
    )

    # No session, but the same system prompt and first exchange: the worker holding them wins.
    other = [*turn2[:3], {"role": "user", "content": "a different follow-up"}]
    _, job3 = _ask(api_url, other)
    assert job3["route"]["reason"].startswith("prefix match: 3/4 messages on " + first_worker), job3["route"]

    wait_settled(redis_client, "", session)  # its blocks reach the record just after the answer
    view = httpx.get(f"{api_url}/v1/sessions/{session}", timeout=10).json()
    assert view["turns"] == 2 and view["last_worker"] == first_worker and view["last_worker_alive"]
    assert view["blocks"] == len(view["token_ids"]) // 16
    assert httpx.delete(f"{api_url}/v1/sessions/{session}", timeout=10).json()["deleted"] is True
    assert httpx.get(f"{api_url}/v1/sessions/{session}", timeout=10).status_code == 404
    assert httpx.get(f"{api_url}/v1/sessions/nope", timeout=10).status_code == 404


def test_dead_workers_session_falls_back_and_stays_exact(
    api_url: str,
    two_workers: tuple[WorkerProcess, WorkerProcess],
    worker_factory: Callable[..., WorkerProcess],
    celery_app: Any,
    redis_client: redis.Redis,
    tokenizer: Any,
    tiny_reference: Reference,
) -> None:
    doomed = worker_factory("doomed")
    session = f"dead-{uuid.uuid4().hex[:8]}"
    turn1 = [{"role": "system", "content": "Dead worker test. " * 12}, {"role": "user", "content": "one"}]
    r1 = _chat(celery_app, turn1, session, doomed.queue)
    assert r1.worker == doomed.name
    wait_settled(redis_client, "", session)  # its blocks reach Redis just after the answer
    doomed.kill()
    wait_for(
        lambda: not redis_client.exists(keys.worker_heartbeat(doomed.name)), 15, "the heartbeat to expire"
    )
    turn2 = [*turn1, {"role": "assistant", "content": r1.text}, {"role": "user", "content": "two"}]
    reply, job = _ask(api_url, turn2, session)
    assert f"session's worker {doomed.name} is gone" in job["route"]["reason"], job["route"]
    assert job["worker"] in {w.name for w in two_workers}
    assert reply["choices"][0]["message"]["content"] == tokenizer.decode(
        _continued(api_url, session, reply, tiny_reference), skip_special_tokens=True
    )
    # resumed from what the dead worker persisted
    assert reply["usage"]["kv_sources"]["redis"] > 0, (reply["usage"], job["route"])
