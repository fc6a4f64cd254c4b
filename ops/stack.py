"""Stack: the whole service on one machine (Redis, N workers, the API, Flower) as child processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import httpx
import redis

from broker.worker_registry import live_workers
from ops.redis_server import RedisServer
from ops.settings import DEFAULT_REDIS_URL, Settings


class Stack:
    def __init__(
        self, settings: Settings, num_workers: int, run_dir: Path | None = None, with_flower: bool = True
    ) -> None:
        self.settings = settings
        self.num_workers = num_workers
        self.with_flower = with_flower
        self.run_dir = run_dir or settings.cache_dir / "run"
        self.redis_server: RedisServer | None = None
        self.children: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def api_url(self) -> str:
        return f"http://{self.settings.api_host}:{self.settings.api_port}"

    @property
    def flower_url(self) -> str:
        return f"http://127.0.0.1:{self.settings.flower_port}"

    def __enter__(self) -> Stack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        log = (self.run_dir / f"{name}.log").open("ab")
        self.children[name] = subprocess.Popen(
            args, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT
        )

    def start(self) -> None:
        if self.settings.redis_url == DEFAULT_REDIS_URL:  # no Redis given: bring our own, persistent
            self.redis_server = RedisServer(self.run_dir / "redis", persist=True).start()
            self.settings = self.settings.with_overrides(redis_url=self.redis_server.url)
        threads = self.settings.torch_threads or max(1, (os.cpu_count() or 1) // self.num_workers)
        env = self.settings.with_overrides(torch_threads=threads).to_env()
        cli = [sys.executable, "-m", "ops.cli"]
        for i in range(1, self.num_workers + 1):
            self._spawn(
                f"worker{i}", [*cli, "worker", "--name", f"w{i}", "--preload", "--loglevel", "WARNING"], env
            )
        self._spawn("api", [*cli, "api"], env)
        if not self.with_flower:
            return
        self._spawn(
            "flower",
            [
                sys.executable,
                "-m",
                "celery",
                "-b",
                self.settings.redis_url,
                "flower",
                f"--port={self.settings.flower_port}",
                "--address=127.0.0.1",
            ],
            {**env, "FLOWER_UNAUTHENTICATED_API": "true"},
        )

    def _check_children(self) -> None:
        for name, child in self.children.items():
            if child.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with {child.returncode}; see {self.run_dir / (name + '.log')}"
                )

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        client = redis.Redis.from_url(self.settings.redis_url)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_children()
            ready = [w for w in live_workers(client) if w.engine is not None]
            if (
                len(ready) >= self.num_workers
                and self._http_ok(f"{self.api_url}/healthz")
                and (not self.with_flower or self._http_ok(f"{self.flower_url}/healthcheck"))
            ):
                return
            time.sleep(0.5)
        raise TimeoutError(f"the stack was not ready after {timeout_s:.0f}s; logs in {self.run_dir}")

    @staticmethod
    def _http_ok(url: str) -> bool:
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def banner(self) -> str:
        return (
            f"kvferry is up: {self.num_workers} worker(s) serving {self.settings.served_model!r}\n"
            f"  API (OpenAI-compatible): {self.api_url}/v1   metrics: {self.api_url}/metrics\n"
            f"  Flower:                  {self.flower_url}\n"
            f"  Redis:                   {self.settings.redis_url}\n"
            f"  logs:                    {self.run_dir}"
        )

    def wait(self) -> None:
        try:
            while True:
                self._check_children()
                time.sleep(1)
        except KeyboardInterrupt:
            pass

    def stop(self) -> None:
        for child in self.children.values():
            if child.poll() is None:
                child.terminate()
        deadline = time.monotonic() + 15
        for child in self.children.values():
            try:
                child.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        self.children.clear()
        if self.redis_server is not None:
            self.redis_server.stop()
            self.redis_server = None
