"""A background response across faults, on the real stack: its worker SIGKILLed mid-answer and
the api that took it SIGKILLed; another worker finishes the job (each token once: the job stream's
fencing), another api's GET records its end once, and its replayed event stream holds each delta
once and spells the final text, token-exact with HF generate."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import httpx
import psutil
import pytest
import redis

from broker import keys
from broker.messages import SessionRecord
from broker.sessions import store as session_store
from ops.redis.server import RedisServer
from tests.integration.conftest import MODEL, WorkerProcess, running_api, wait_for
from tests.integration.test_responses import _events, responses_api  # noqa: F401

Reference = Callable[[list[int], int], list[int]]
TOKENS = 600  # long enough that the victim is mid-answer when it dies (a few seconds of it)


def _sigkill_api(url: str) -> None:
    port = url.rsplit(":", 1)[1]
    (api,) = [
        p
        for p in psutil.process_iter(["pid", "cmdline"])
        if p.info["cmdline"] and "api" in p.info["cmdline"] and port in p.info["cmdline"]
    ]
    api.send_signal(signal.SIGKILL)
    api.wait(10)


def _alive(client: redis.Redis, name: str) -> bool:
    return bool(client.exists(keys.worker_heartbeat(name)))


def test_background_survives_a_worker_sigkill_and_an_api_sigkill(
    responses_api: str,  # noqa: F811
    two_workers: tuple[WorkerProcess, WorkerProcess],
    worker_factory: Callable[..., WorkerProcess],
    redis_server: RedisServer,
    redis_client: redis.Redis,
    tmp_path_factory: pytest.TempPathFactory,
    tiny_reference: Reference,
) -> None:
    victim = worker_factory("resp-victim")
    for w in two_workers:  # only the victim live: the job goes there
        w.process.send_signal(signal.SIGSTOP)
    try:
        wait_for(
            lambda: not any(_alive(redis_client, w.name) for w in two_workers),
            20,
            "paused workers' heartbeats",
        )
        log = tmp_path_factory.mktemp("api-doomed") / "api.log"
        doomed = running_api(["--redis-url", redis_server.url, "--model", MODEL], {**os.environ}, log)
        url = next(doomed)
        created = httpx.post(
            f"{url}/v1/responses",
            json={
                "model": MODEL,
                "input": "go",
                "background": True,
                "max_output_tokens": TOKENS,
                "temperature": 0,
            },
            timeout=30,
        ).json()
        rid = created["id"]
        assert created["status"] == "queued", created
        live: list[dict[str, Any]] = []  # a client following it live, resumed from its start
        follower = threading.Thread(target=lambda: live.extend(_events(responses_api, rid, -1)), daemon=True)
        follower.start()
        _sigkill_api(url)  # the api that took it is gone: its watcher with it
        doomed.close()
        job_id = json.loads(redis_client.get(keys.response_record("", rid)) or b"{}")["job_id"]
        wait_for(lambda: redis_client.xlen(keys.job_stream(job_id)) >= 2, 60, "the victim's first tokens")
        victim.kill()
    finally:
        for w in two_workers:
            w.process.send_signal(signal.SIGCONT)

    def ended() -> bool:
        status = httpx.get(f"{responses_api}/v1/responses/{rid}", timeout=30).json()["status"]
        return status in ("completed", "incomplete")

    wait_for(ended, 120, "the response to end on another worker")
    final = httpx.get(f"{responses_api}/v1/responses/{rid}", timeout=30).json()
    assert final["worker"] != victim.name, final
    text = final["output"][0]["content"][0]["text"]
    follower.join(60)
    events = _events(responses_api, rid, -1)
    assert live == events  # the live stream, across the kill: the same events, each delta once
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == text
    assert sum(e["type"] == "response.output_item.added" for e in events) == 1
    record = session_store.load(redis_client, "", rid)
    assert isinstance(record, SessionRecord)
    n_in = final["usage"]["input_tokens"]
    prompt: list[Any] = list(record.token_ids[:n_in])
    assert list(record.token_ids[n_in:]) == tiny_reference(prompt, final["usage"]["output_tokens"])
    assert redis_client.exists(keys.response_final("", rid))  # its end applied once
