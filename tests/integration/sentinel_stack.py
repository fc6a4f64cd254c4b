"""The queue Redis under Sentinel for the integration tests: LocalHA (a primary, a replica, three
sentinels), and `kvferry worker` / `kvferry api` processes pointed at the sentinels."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from broker.redis.connect import connect, queue_address
from broker.worker_registry import live_workers
from ops.redis.ha import LocalHA
from ops.stack.redis import HA_LEASE_TTL_S
from tests.integration import conftest
from tests.integration.conftest import MODEL, ROOT, WorkerProcess, wait_for


def ha_env(ha: LocalHA, kvferry_cache_dir: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "KVFERRY_CACHE_DIR": str(kvferry_cache_dir),
        "KVFERRY_REDIS_URL": ha.redis_url,
        "KVFERRY_REDIS_SENTINELS": ha.sentinels,
        "KVFERRY_REDIS_MASTER": ha.master,
        "KVFERRY_HEARTBEAT_TTL_S": "3",
        "KVFERRY_JOB_LEASE_TTL_S": str(HA_LEASE_TTL_S),  # as serve --ha: a lease outlives a failover
    }


def address(ha: LocalHA) -> str:
    return queue_address(ha.redis_url, ha.sentinels, ha.master)


def start_worker(ha: LocalHA, name: str, model_dir: Path, cache_dir: Path, log: Path) -> WorkerProcess:
    args = [sys.executable, "-m", "ops.cli.main", "worker", "--name", name, "--model", str(model_dir)]
    args += ["--served-model-name", MODEL, "--cache-size", "4M", "--torch-threads", "1"]
    args += ["--redis-cache-size", "0", "--preload", "--loglevel", "INFO"]
    process = subprocess.Popen(
        args, cwd=ROOT, env=ha_env(ha, cache_dir), stdout=log.open("wb"), stderr=subprocess.STDOUT
    )
    client = connect(address(ha))
    node: list[str] = []

    def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"worker {name} exited:\n{log.read_text()[-3000:]}")
        node.extend(w.name for w in live_workers(client) if w.name.startswith(f"{name}@") and w.engine)
        return bool(node)

    wait_for(ready, 90, f"worker {name}")
    return WorkerProcess(node[0], process, log)


def running_api(ha: LocalHA, cache_dir: Path, log: Path, **env: str) -> Iterator[str]:
    """`kvferry api` pointed at the sentinels (tests/integration/conftest.py's launcher)."""
    yield from conftest.running_api(["--model", MODEL], {**ha_env(ha, cache_dir), **env}, log)
