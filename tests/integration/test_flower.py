"""Flower, as `kvferry serve` runs it (basic auth, its API too), lists the workers with their KV
figures; workers send task events only while a monitor such as Flower asks for them."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
import redis

from ops.redis.server import RedisServer, free_port
from tests.integration import jobs
from tests.integration.conftest import ROOT, WorkerProcess, wait_for

AUTH = ("kvferry", "flower-test-password")


@contextlib.contextmanager
def running_flower(broker_url: str) -> Iterator[str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "FLOWER_UNAUTHENTICATED_API"}
    # As ops/stack/stack.py starts it: broker and credentials through the environment, not argv.
    env |= {"BROKER_URL": broker_url, "FLOWER_BASIC_AUTH": ":".join(AUTH)}
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "flower", f"--port={port}", "--address=127.0.0.1"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{url}/healthcheck", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, 30, "flower")
        yield url
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture
def flower_url(redis_server: RedisServer) -> Iterator[str]:
    with running_flower(redis_server.url) as url:
        yield url


def test_flower_api_lists_workers_with_kv_figures(
    two_workers: tuple[WorkerProcess, WorkerProcess], flower_url: str
) -> None:
    api = f"{flower_url}/api/workers"
    assert httpx.get(api, params={"refresh": "1"}, timeout=30).status_code == 401
    assert httpx.get(api, auth=(AUTH[0], "wrong"), timeout=30).status_code == 401
    response = httpx.get(api, params={"refresh": "1"}, auth=AUTH, timeout=30)
    assert response.status_code == 200
    workers = response.json()
    for worker in two_workers:
        assert worker.name in workers, sorted(workers)
        stats = workers[worker.name]["stats"]  # flat `kvferry.*` fields: rows of the worker page
        assert stats["kvferry.model"] == "tiny" and stats["kvferry.queue"] == worker.queue
        assert re.fullmatch(r"\d+ / [1-9]\d* blocks \(\d+\.\d %\)", stats["kvferry.kv_pool_used"])
        assert stats["kvferry.prefix_hit_rate"].endswith("prompt tokens")
        assert stats["kvferry.kv_pool_size"].endswith(")") and "MiB" in stats["kvferry.kv_pool_size"]
        assert not any(isinstance(v, dict) for k, v in stats.items() if k.startswith("kvferry"))


def test_task_events_only_while_a_monitor_asks(
    worker_factory: Callable[..., WorkerProcess], celery_app: object, redis_server: RedisServer
) -> None:
    """Celery's default: no task events (three Redis publishes a job, paid in a short job's latency:
    docs/benchmarks.md) until a monitor enables them; Flower does, every few seconds, and then lists the jobs.
    A worker of its own: Flower leaves events on in the workers it has seen."""
    worker = worker_factory("events")  # stopped after this test: it would serve the shared queue
    client = redis.Redis.from_url(redis_server.url)
    events = client.pubsub(ignore_subscribe_messages=True)
    events.psubscribe("*celeryev*")  # kombu's fanout exchange for Celery events, on Redis
    try:
        jobs.send(celery_app, jobs.token_job([5, 6, 7], 2), queue=worker.queue).get(timeout=60)
        seen: list[tuple[bytes, set[str]]] = []  # (channel, hostnames of its events)
        until = time.monotonic() + 2.5  # a worker heartbeat (an event of its own) every 2 s
        while (message := events.get_message(timeout=max(0.0, until - time.monotonic()))) or (
            time.monotonic() < until
        ):
            if message:
                seen.append((message["channel"], _hostnames(message["data"])))
    finally:
        events.close()
        client.close()
    # e.g. b"/0.celeryev/worker.heartbeat", b"/0.celeryev/task.multi": the routing key comes last
    assert any(b"celeryev/worker." in c and worker.name in h for c, h in seen), seen
    mine = [c for c, h in seen if b"celeryev/task." in c and worker.name in h]  # others: other tests'
    assert not mine, f"task events with no monitor asking: {mine}"

    with running_flower(redis_server.url) as url:

        def listed() -> bool:
            job = jobs.send(celery_app, jobs.token_job([5, 6, 8], 2), queue=worker.queue)
            job.get(timeout=60)
            tasks = httpx.get(f"{url}/api/tasks", auth=AUTH, timeout=10).json()
            return job.id in tasks

        wait_for(listed, 60, "a job in Flower's task list")


def _hostnames(data: bytes) -> set[str]:
    """The senders of the events in one kombu message (one event, or a list of buffered ones)."""
    body = json.loads(base64.b64decode(json.loads(data)["body"]))
    return {event.get("hostname", "") for event in (body if isinstance(body, list) else [body])}
