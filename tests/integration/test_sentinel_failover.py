"""The queue Redis under Sentinel, its primary SIGKILLed: a 202'd job is on the replica before
its 202 (api/jobs/submit_write.py) and completes after the promotion; a job streaming through
the api when the primary dies ends token-exact, each token once in what the client received, and
the worker lives on."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer

from api.jobs.client import JobClient
from api.jobs.meta import JobMeta
from broker.celery_app import BrokerConfig
from broker.jobs import events as job_events
from broker.redis.connect import connect, connect_async
from ops.redis.ha import LocalHA
from ops.redis.server import free_port
from tests.integration import sentinel_stack
from tests.integration.conftest import MODEL, ROOT, WorkerProcess, wait_for
from tests.integration.jobs import random_prompt, token_job
from tests.integration.test_redis_restart import _assert_no_gap_and_each_token_once_to_readers

Reference = Callable[[list[int], int], list[int]]


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalHA]:
    with LocalHA(tmp_path_factory.mktemp("ha")) as local:
        yield local


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ha-logs")


@pytest.fixture(scope="module")
def ha_api(ha: LocalHA, kvferry_cache_dir: Path, logs: Path) -> Iterator[str]:
    # a replica stopped for a moment must not turn the accept into an unreplicated one
    yield from sentinel_stack.running_api(
        ha, kvferry_cache_dir, logs / "api.log", KVFERRY_ACCEPT_WAIT_MS="10000"
    )


@pytest.fixture(scope="module")
def workers(
    ha: LocalHA, tiny_model_dir: Path, kvferry_cache_dir: Path, logs: Path
) -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        worker.stop()


def _text(tiny_model_dir: Path, ids: list[int]) -> str:
    return str(AutoTokenizer.from_pretrained(tiny_model_dir).decode(ids, skip_special_tokens=True))


def _body(prompt: list[int], n: int, **more: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, **more}


def test_clients_retry_a_command_on_the_new_primary_after_a_failover(ha: LocalHA) -> None:
    """redis-py 8.1 reconnects inside a command's retry without asking the sentinels: without
    broker/redis/connect.py's connection class, both would retry against the dead primary's
    address until their retries run out (about 30 s)."""
    address = sentinel_stack.address(ha)
    sync = connect(address)
    script = sync.register_script("return redis.call('INCR', KEYS[1])")

    async def async_side() -> tuple[Any, Any]:
        client = connect_async(address)
        ascript = client.register_script("return redis.call('INCR', KEYS[1])")
        await ascript(keys=["t:async"])
        ha.failover()
        started = time.monotonic()
        value = await ascript(keys=["t:async"])
        return value, time.monotonic() - started

    script(keys=["t:sync"])
    value, took = asyncio.run(async_side())  # its failover is the sync client's too
    assert value == 2 and took < 5
    started = time.monotonic()
    assert script(keys=["t:sync"]) == 2 and time.monotonic() - started < 5


def test_with_the_replica_down_a_job_is_accepted_after_the_wait_and_counted(ha: LocalHA) -> None:
    """The documented choice: no replica within accept_wait_ms, the job is accepted anyway (as
    safe as on one Redis) and counted, rather than refused."""
    replica = next(s for s in ha.servers if s.port != ha.primary_port())
    assert replica.process is not None
    missed: list[int] = []

    async def submit() -> float:
        client = JobClient(
            BrokerConfig(redis_url=sentinel_stack.address(ha)),
            job_ttl_s=60,
            accept_replicas=1,
            accept_wait_ms=300,
            on_unreplicated=lambda: missed.append(1),
        )
        meta = JobMeta(str(uuid.uuid4()), "/v1/completions", MODEL, "kvferry.test.void", "test", time.time())
        started = time.monotonic()
        try:
            await client.submit(meta, token_job(random_prompt(264), 4))
            assert await client.meta(meta.job_id) is not None
            return time.monotonic() - started
        finally:
            await client.close()

    os.kill(replica.process.pid, signal.SIGSTOP)
    try:
        took = asyncio.run(submit())
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)
    assert missed == [1] and 0.3 <= took < 5
    connect(sentinel_stack.address(ha)).delete("kvferry.test.void")


def test_a_202d_job_is_on_the_replica_before_its_202_and_survives_the_primarys_sigkill(
    ha: LocalHA,
    ha_api: str,
    workers: list[WorkerProcess],
    tiny_model_dir: Path,
    kvferry_cache_dir: Path,
    logs: Path,
    tiny_reference: Reference,
) -> None:
    prompt, n = random_prompt(261), 12
    replica = next(s for s in ha.servers if s.port != ha.primary_port())
    assert replica.process is not None
    os.kill(replica.process.pid, signal.SIGSTOP)  # it receives nothing, acknowledges nothing
    reply: list[httpx.Response] = []
    submit = threading.Thread(
        target=lambda: reply.append(
            httpx.post(
                f"{ha_api}/v1/jobs",
                json={"endpoint": "/v1/completions", "body": _body(prompt, n)},
                timeout=30,
            )
        )
    )
    try:
        submit.start()
        submit.join(1.0)
        assert not reply, "a 202 went out before the replica held the job"
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)
    submit.join(15)
    assert reply and reply[0].status_code == 202, reply
    job_id = reply[0].json()["id"]
    killed = ha.kill_primary()  # no worker has seen the job: only the replica's copy can save it
    ha.wait_promoted(killed.port)
    ha.restart_as_replica(killed)
    workers.append(
        sentinel_stack.start_worker(ha, "ha-late", tiny_model_dir, kvferry_cache_dir, logs / "w.log")
    )
    deadline = time.monotonic() + 60
    while True:
        job = httpx.get(f"{ha_api}/v1/jobs/{job_id}", timeout=30).json()
        if job["status"] in ("succeeded", "failed", "cancelled") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert job["status"] == "succeeded", job
    assert job["result"]["choices"][0]["text"] == _text(tiny_model_dir, tiny_reference(prompt, n))


def test_a_failover_mid_stream_ends_the_job_exact_each_token_once_and_the_worker_alive(
    ha: LocalHA,
    ha_api: str,
    workers: list[WorkerProcess],
    tiny_model_dir: Path,
    kvferry_cache_dir: Path,
    logs: Path,
    tiny_reference: Reference,
) -> None:
    if not workers:
        workers.append(
            sentinel_stack.start_worker(ha, "ha-w", tiny_model_dir, kvferry_cache_dir, logs / "w2.log")
        )
    worker = workers[0]
    prompt, n = random_prompt(262), 300
    client = connect(sentinel_stack.address(ha))
    received: list[str] = []
    job_ids: list[str] = []
    refused: list[str] = []
    done = threading.Event()

    def stream() -> None:
        with httpx.stream(
            "POST", f"{ha_api}/v1/completions", json=_body(prompt, n, stream=True), timeout=120
        ) as r:
            if r.status_code != 200:  # say what the API answered instead of a KeyError in a thread
                refused.append(f"{r.status_code}: {r.read().decode(errors='replace')[:500]}")
                return
            job_ids.append(r.headers["x-job-id"])
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    received.extend(c["text"] for c in chunk.get("choices", []))
        done.set()

    reader = threading.Thread(target=stream)
    started = time.monotonic()
    reader.start()
    wait_for(lambda: len("".join(received)) > 0 or bool(refused), 60, "the first streamed tokens")
    assert not refused, f"the API refused the streamed job: {refused}"
    assert not done.is_set(), "the job ended before the kill: make it longer"
    t0 = time.monotonic()
    killed = ha.kill_primary()
    ha.wait_promoted(killed.port)
    promoted_s = time.monotonic() - t0
    ha.restart_as_replica(killed)
    reader.join(120)
    assert done.is_set(), "the stream did not end"
    print(f"promoted after {promoted_s:.1f}s; the stream took {time.monotonic() - started:.1f}s")
    expected = tiny_reference(prompt, n)
    assert "".join(received) == _text(tiny_model_dir, expected)  # a token twice would show twice
    assert job_events.ended(client, job_ids[0])
    _assert_no_gap_and_each_token_once_to_readers(client, job_ids[0], expected)
    assert worker.process.poll() is None, f"the worker exited: {worker.log.read_text()[-3000:]}"
    assert promoted_s < 15
    after = random_prompt(263)  # its consumer follows the failover too: it takes new jobs
    reply = httpx.post(f"{ha_api}/v1/completions", json=_body(after, 6), timeout=60)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["text"] == _text(tiny_model_dir, tiny_reference(after, 6))


def test_flower_follows_the_sentinels(
    ha: LocalHA, workers: list[WorkerProcess], kvferry_cache_dir: Path
) -> None:
    """Flower as `serve --ha` starts it: our Celery app (ops/stack/flower_app.py) with Sentinel's
    transport options from the settings; its API lists the worker, after the failovers above."""
    assert workers, "runs after the tests that start the worker"
    port = free_port()
    env = {**sentinel_stack.ha_env(ha, kvferry_cache_dir), "FLOWER_BASIC_AUTH": "u:p"}
    env.pop("FLOWER_UNAUTHENTICATED_API", None)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "ops.stack.flower_app",
            "flower",
            f"--port={port}",
            "--address=127.0.0.1",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/api/workers"
    try:

        def listed() -> bool:
            try:
                reply = httpx.get(url, params={"refresh": "1"}, auth=("u", "p"), timeout=10)
            except httpx.HTTPError:
                return False
            return reply.status_code == 200 and workers[0].name in reply.json()

        wait_for(listed, 45, "the worker in Flower's API")
    finally:
        process.terminate()
        process.wait(10)
