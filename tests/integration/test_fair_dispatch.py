"""Fair dispatch through the real api (a process) and a real worker: tenant A's flood is parked
beyond the window and tenant B's single job starts before A's parked ones; parked jobs survive an
api SIGKILL (another api process takes the dispatcher lease, releases them, each runs once); every
answer is token-exact against HF generate."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from broker import keys
from broker.worker_registry import live_workers
from ops.redis.server import RedisServer, free_port
from tests.integration.conftest import MODEL, ROOT, WorkerProcess, wait_for

ALICE, BOB = "key-alice", "key-bob"
HEADROOM = 2
NEW_TOKENS = 48
Reference = Callable[[list[int], int], list[int]]


class Api:
    """`kvferry api` as a process of its own (killable), with two tenants and fair dispatch."""

    def __init__(self, redis_url: str, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "KVFERRY_API_KEYS": f"{ALICE}:alice,{BOB}:bob"}
        args = ["api", "--port", str(self.port), "--redis-url", redis_url, "--model", MODEL]
        args += ["--dispatch-headroom", str(HEADROOM), "--fair-quota", "1"]
        self.log = log
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ops.cli.main", *args],
            cwd=ROOT,
            env=env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        wait_for(self._up, 30, "the api")

    def _up(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"api exited:\n{self.log.read_text()[-3000:]}")
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def submit(self, key: str, prompt: str) -> str:
        body = {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": NEW_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
        }
        r = httpx.post(
            f"{self.url}/v1/jobs",
            json={"endpoint": "/v1/completions", "body": body},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        assert r.status_code == 202, r.text
        return str(r.json()["id"])

    def result(self, key: str, job_id: str, timeout_s: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            r = httpx.get(
                f"{self.url}/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {key}"}, timeout=30
            )
            view = r.json()
            if view["status"] in ("succeeded", "failed", "cancelled"):
                return dict(view)
            time.sleep(0.1)
        raise TimeoutError(f"job {job_id} did not finish")

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A queue Redis of this module's own: the session's workers (tests/integration/conftest.py
    `two_workers`) live on the shared one and would take the flood at once, parking nothing."""
    with RedisServer(tmp_path_factory.mktemp("fair-redis")) as server:
        yield server


@pytest.fixture
def redis_client(own_redis: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(own_redis.url)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def apis(own_redis: RedisServer, tmp_path: Path) -> Iterator[Callable[[], Api]]:
    started: list[Api] = []

    def start() -> Api:
        started.append(Api(own_redis.url, tmp_path / f"api-{len(started)}.log"))
        return started[-1]

    yield start
    for api in started:
        api.stop()


@pytest.fixture
def fair_worker(
    worker_factory: Callable[..., WorkerProcess], own_redis: RedisServer, redis_client: redis.Redis
) -> Iterator[WorkerProcess]:
    # prefill steps half a second slower: the flood is still parked when the test looks
    args = ("--concurrency", "4", "--debug-slow-step-s", "0.5")
    yield worker_factory("fair", *args, redis_url=own_redis.url)


def window(client: redis.Redis) -> int:
    """The fleet's window as the api computes it."""
    return sum(max(0, w.concurrency - HEADROOM) for w in live_workers(client) if w.concurrency > 0)


def expected_text(tokenizer: Any, reference: Reference, prompt: str) -> str:
    return str(
        tokenizer.decode(reference(tokenizer(prompt)["input_ids"], NEW_TOKENS), skip_special_tokens=True)
    )


def started_at(client: redis.Redis, job_id: str) -> float:
    """When a worker's engine took the job (its stage times)."""
    return float(client.hget(keys.job_stages(job_id), "submitted") or 0)


def test_single_request_starts_before_a_flood_and_answers_are_exact(
    apis: Callable[[], Api],
    fair_worker: WorkerProcess,
    redis_client: redis.Redis,
    tokenizer: Any,
    tiny_reference: Reference,
) -> None:
    api = apis()
    time.sleep(1.2)  # the api's fleet cache has the worker's concurrency
    flood = window(redis_client) + 8
    prompts = [f"Story number {i} begins" for i in range(flood)]
    with ThreadPoolExecutor(8) as pool:
        alice = list(pool.map(lambda p: api.submit(ALICE, p), prompts))
    bob = api.submit(BOB, "A single question from Bob")
    assert redis_client.zscore(keys.PARKED, bob) is None  # under his quota: straight to the queue
    still_parked = [j for j in alice if redis_client.zscore(keys.PARKED, j) is not None]
    assert len(still_parked) >= 4
    everyone = [*alice, bob]
    with ThreadPoolExecutor(8) as pool:
        found = pool.map(lambda j: api.result(BOB if j == bob else ALICE, j), everyone)
        views = dict(zip(everyone, found, strict=True))
    for job_id, prompt in zip([*alice, bob], [*prompts, "A single question from Bob"], strict=True):
        assert views[job_id]["status"] == "succeeded", views[job_id]
        assert views[job_id]["result"]["choices"][0]["text"] == expected_text(
            tokenizer, tiny_reference, prompt
        )
    bob_start = started_at(redis_client, bob)
    assert bob_start > 0
    assert all(bob_start < started_at(redis_client, j) for j in still_parked)
    assert redis_client.zcard(keys.PARKED) == 0


def test_parked_jobs_survive_an_api_sigkill(
    apis: Callable[[], Api],
    fair_worker: WorkerProcess,
    redis_client: redis.Redis,
    tokenizer: Any,
    tiny_reference: Reference,
) -> None:
    first = apis()
    time.sleep(1.2)
    prompts = [f"Tale {i} of the restart" for i in range(window(redis_client) + 6)]
    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(lambda p: first.submit(ALICE, p), prompts))
    parked = [j for j in ids if redis_client.zscore(keys.PARKED, j) is not None]
    first.kill()
    assert parked, "nothing was parked when the api died"
    second = apis()
    for job_id, prompt in zip(ids, prompts, strict=True):
        view = second.result(ALICE, job_id)
        assert view["status"] == "succeeded", view
        assert view["attempts"] == 1  # ran once
        assert view["result"]["choices"][0]["text"] == expected_text(tokenizer, tiny_reference, prompt)
    assert redis_client.zcard(keys.PARKED) == 0
    assert all(redis_client.xlen(keys.job_end(j)) == 1 for j in ids)
