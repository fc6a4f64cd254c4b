"""Real `kvferry worker` processes for the integration tests: one started, waited for until its
heartbeat says its engine is ready, and stopped. Several asked for together start at once: each
start is seconds of imports and a model load, and they overlap instead of adding up."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import redis

from broker import keys
from broker.worker_registry import live_workers

ROOT = Path(__file__).resolve().parents[2]
MODEL = "tiny"
READY_TIMEOUT_S = 90.0


@dataclass
class WorkerProcess:
    name: str  # node name, name@host
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def queue(self) -> str:
        return keys.worker_queue(self.name)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        stop_all([self])


def stop_all(workers: Sequence[WorkerProcess]) -> None:
    """SIGTERM them all first, then wait for each: a worker's exit takes a second or two (its drain,
    then the interpreter's), and they overlap instead of adding up."""
    running = [w.process for w in workers if w.process.poll() is None]
    for process in running:
        process.terminate()
    for process in running:
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.1)


@dataclass(frozen=True, slots=True)
class WorkerLaunch:
    """What every test worker shares: its Redis (unless a start names another), model and logs."""

    redis_url: str
    model_dir: Path
    cache_dir: Path
    logs: Path

    def args(self, name: str, url: str, extra: Sequence[str]) -> list[str]:
        return [
            sys.executable, "-m", "ops.cli.main", "worker", "--name", name, "--redis-url", url,
            "--model", str(self.model_dir), "--served-model-name", MODEL, "--cache-size", "4M",
            "--torch-threads", "1", "--concurrency", "16", "--preload", "--loglevel", "INFO", *extra,
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "KVFERRY_CACHE_DIR": str(self.cache_dir),
            "KVFERRY_HEARTBEAT_TTL_S": "3",
            # off unless a test asks (--warm-start-size): a worker started later would otherwise
            # warm other tests' sessions, and their kv sources would change with the test order
            "KVFERRY_WARM_START_SIZE": "0",
        }


class _Starting:
    """One worker process spawned, not yet known ready."""

    def __init__(self, launch: WorkerLaunch, name: str, extra: Sequence[str], url: str, log: Path) -> None:
        self.name, self.log, self.node = name, log, ""
        self.client = redis.Redis.from_url(url)
        self.process = subprocess.Popen(
            launch.args(name, url, extra), cwd=ROOT, env=launch.env(), stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )  # fmt: skip

    def ready(self) -> bool:
        if self.node:
            return True
        if self.process.poll() is not None:
            raise RuntimeError(f"worker {self.name} exited:\n{self.log.read_text()[-3000:]}")
        for w in live_workers(self.client):
            if w.name.startswith(f"{self.name}@") and w.engine is not None:
                self.node = w.name
        return bool(self.node)


class WorkerStarter:
    """`start(name, *extra_cli_args, redis_url=None)`: a worker serving the tiny model, returned
    once ready; `start.several((name, *extra), ..., redis_url=None)`: several, spawned together.
    Every worker started is kept in each of `keeps` (whoever stops them at the end)."""

    def __init__(
        self, launch: WorkerLaunch, *keeps: list[WorkerProcess], numbers: Iterator[int] | None = None
    ) -> None:
        self.launch, self.keeps = launch, keeps
        # in each log's name: a name started again (another test) never overwrites the old log
        self._numbers = numbers or itertools.count()

    def __call__(self, name: str, *extra: str, redis_url: str | None = None) -> WorkerProcess:
        return self.several((name, *extra), redis_url=redis_url)[0]

    def several(self, *specs: Sequence[str], redis_url: str | None = None) -> list[WorkerProcess]:
        url = redis_url or self.launch.redis_url
        starting: list[_Starting] = []
        try:
            for name, *extra in specs:
                log = self.launch.logs / f"{name}-{next(self._numbers)}.log"
                starting.append(_Starting(self.launch, name, extra, url, log))
            wait_for(lambda: all(s.ready() for s in starting), READY_TIMEOUT_S, f"workers {list(specs)}")
        except BaseException:  # never ready: kept nowhere, so nothing else would stop them
            for s in starting:
                s.process.kill()
                s.process.wait(10)
            raise
        workers = [WorkerProcess(s.node, s.process, s.log) for s in starting]
        for kept in self.keeps:
            kept.extend(workers)
        return workers

    def scoped(self, kept: list[WorkerProcess]) -> WorkerStarter:
        """A starter whose workers `kept` holds too (a test's own, stopped after it)."""
        return WorkerStarter(self.launch, *self.keeps, kept, numbers=self._numbers)
