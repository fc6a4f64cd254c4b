"""Flower, as `kvferry serve` runs it (basic auth, its API too), lists the workers with their KV
figures."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from ops.redis_server import RedisServer, free_port
from tests.integration.conftest import ROOT, WorkerProcess, wait_for

AUTH = ("kvferry", "flower-test-password")


@pytest.fixture
def flower_url(redis_server: RedisServer, tmp_path: object) -> Iterator[str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "FLOWER_UNAUTHENTICATED_API"}
    # As ops/stack.py starts it: broker and credentials through the environment, not argv.
    env |= {"BROKER_URL": redis_server.url, "FLOWER_BASIC_AUTH": ":".join(AUTH)}
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
        figures = workers[worker.name]["stats"]["kvferry"]
        assert figures["model"] == "tiny"
        assert figures["engine"]["pool_blocks_total"] > 0
        assert 0.0 <= figures["kv_usage"] <= 1.0 and "prefix_hit_rate" in figures
        assert figures["queue"] == worker.queue
