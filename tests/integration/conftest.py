"""Real parts: a redis-server and real `kvferry worker` processes (Celery, threads pool) serving a
tiny random Llama saved as a local model directory."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from broker.celery_app import BrokerConfig, make_celery
from kvstore.layout import KVLayout
from ops.redis.server import RedisServer
from tests.integration.worker_process import (
    MODEL,
    ROOT,
    WorkerLaunch,
    WorkerProcess,
    WorkerStarter,
    stop_all,
    wait_for,
)
from workers.engine.model.precision import Precision

__all__ = ["MODEL", "ROOT", "WorkerProcess", "WorkerStarter", "running_api", "stop_all", "wait_for"]


def tiny_block_bytes(block_size: int = 16) -> int:
    """One KV block of the tiny Llama (2 layers, 2 KV heads of 16) in the pool dtype of this run's
    workers: fp32 unless KVFERRY_TEST_* say otherwise (tests/conftest.py)."""
    env = os.environ
    precision = Precision.resolve(
        env["KVFERRY_DTYPE"], env["KVFERRY_KV_CACHE_DTYPE"], "cpu", env["KVFERRY_QUANTIZATION"]
    )
    return KVLayout(2, 2, 16, block_size, precision.kv_torch).bytes_per_block


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="session")
def redis_client(redis_server: RedisServer) -> redis.Redis:
    return redis.Redis.from_url(redis_server.url)


@pytest.fixture(scope="session")
def celery_app(redis_server: RedisServer) -> object:
    return make_celery(BrokerConfig(redis_url=redis_server.url))


@pytest.fixture(scope="session")
def start_worker(
    redis_server: RedisServer,
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    kvferry_cache_dir: Path,
) -> Iterator[WorkerStarter]:
    """start_worker(name, *extra_cli_args, redis_url=None): a `kvferry worker` process serving the
    tiny model, returned once its heartbeat says its engine is ready; start_worker.several(...)
    starts several at once (tests/integration/worker_process.py)."""
    started: list[WorkerProcess] = []
    logs = tmp_path_factory.mktemp("worker-logs")
    yield WorkerStarter(WorkerLaunch(redis_server.url, tiny_model_dir, kvferry_cache_dir, logs), started)
    stop_all(started)


@pytest.fixture(scope="session")
def two_workers(start_worker: WorkerStarter) -> tuple[WorkerProcess, WorkerProcess]:
    w1, w2 = start_worker.several(("w1",), ("w2",))
    return w1, w2


@pytest.fixture(scope="session")
def tiny_hf(tiny_model_dir: Path) -> Any:
    """The HF model of the same weights the workers load (tests/integration/near_tie.py takes it)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


@pytest.fixture(scope="session")
def tiny_reference(tiny_hf: Any) -> Callable[[list[int], int], list[int]]:
    """HF greedy `generate` on the same weights the workers load: the ground truth."""
    import torch

    model = tiny_hf

    def greedy(prompt: list[int], new_tokens: int) -> list[int]:
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False
            )
        return out[0, len(prompt) :].tolist()

    return greedy


def running_api(args: list[str], env: dict[str, str], log: Path) -> Iterator[str]:
    """`kvferry api` as a process with `args` (besides its port) and `env`; its URL once /healthz
    answers, until the caller is done (a generator: `yield from` it in a fixture)."""
    import httpx

    from ops.redis.server import free_port

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "ops.cli.main", "api", "--port", str(port), *args],
        cwd=ROOT,
        env={"PYTHONUNBUFFERED": "1", **env},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"api exited:\n{log.read_text()[-3000:]}")
        try:
            return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, 30, "the api")
        yield url
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture(scope="session")
def files_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The file store of every api on the session's Redis: replicas must share one (any of them may
    run a batch whose input another received)."""
    return tmp_path_factory.mktemp("files")


@pytest.fixture(scope="session")
def api_url(
    redis_server: RedisServer, files_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """`kvferry api` as a process, serving the tiny model's name."""
    log = tmp_path_factory.mktemp("api") / "api.log"
    env = {**os.environ, "KVFERRY_FILES_DIR": str(files_dir)}
    yield from running_api(["--redis-url", redis_server.url, "--model", MODEL], env, log)


@pytest.fixture
def worker_factory(start_worker: WorkerStarter) -> Iterator[WorkerStarter]:
    """Workers for one test only (stopped after it), so they never take other tests' jobs."""
    mine: list[WorkerProcess] = []
    yield start_worker.scoped(mine)
    stop_all(mine)
