"""Stack: the whole service on one machine (two Redis, N workers, the API, Flower) as child processes.

Secure by default: both Redis servers get a generated password and Flower generated basic-auth
credentials (its API, which can revoke tasks and shut workers down, then needs them too). The
URLs and secrets go to ``stack.json`` (0600) in the run directory, never to the terminal, and
never on a command line (any local user can read those in `ps`).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import httpx

from broker.redis.connect import connect
from broker.worker_registry import live_workers
from ops.redis.cluster import LocalCluster
from ops.redis.ha import LocalHA
from ops.redis.server import RedisServer, write_private
from ops.settings import Settings
from ops.stack.redis import KV_EVICTION_POLICY, kv_maxmemory, start_ha, start_redis

__all__ = ["KV_EVICTION_POLICY", "Stack", "kv_maxmemory", "redact"]
FLOWER_USER = "kvferry"
STACK_FILE = "stack.json"


def redact(url: str) -> str:
    """The URL with its password replaced by ***, for logs and banners."""
    return re.sub(r"(://[^:@/]*):[^@/]+@", r"\1:***@", url)


class Stack:
    def __init__(
        self,
        settings: Settings,
        num_workers: int,
        run_dir: Path | None = None,
        with_flower: bool = True,
        ha: bool = False,
    ) -> None:
        self.settings = settings
        self.with_ha = ha  # the queue Redis under Sentinel (ops/redis/ha.py)
        self.ha: LocalHA | None = None
        self.num_workers = num_workers
        self.with_flower = with_flower
        self.run_dir = run_dir or settings.cache_dir / "run"
        self.redis_servers: list[RedisServer | LocalCluster] = []
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self._specs: dict[str, tuple[list[str], dict[str, str], tuple[str, ...]]] = {}  # to restart one
        self.flower_user = FLOWER_USER
        self.flower_password = secrets.token_urlsafe(18)
        self._wrote_stack_file = False
        self._env: dict[str, str] = {}

    @property
    def api_url(self) -> str:
        return f"http://{self.settings.api_host}:{self.settings.api_port}"

    @property
    def flower_url(self) -> str:
        return f"http://127.0.0.1:{self.settings.flower_port}"

    @property
    def stack_file(self) -> Path:
        return self.run_dir / STACK_FILE

    @property
    def kv_cluster(self) -> LocalCluster | None:
        """The KV tier's local Redis Cluster (--kv-shards), whose shards chaos may kill."""
        return next((s for s in self.redis_servers if isinstance(s, LocalCluster)), None)

    @property
    def kv_redis_url(self) -> str:
        return self.settings.kv_redis_url or self.settings.queue_url

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

    def _spawn(self, name: str, args: list[str], env: dict[str, str], drop: tuple[str, ...] = ()) -> None:
        self._specs[name] = (args, env, drop)
        log = (self.run_dir / f"{name}.log").open("ab")
        child_env = {k: v for k, v in os.environ.items() if k not in drop}
        self.children[name] = subprocess.Popen(
            args,
            env={**child_env, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            # A worker is its own session, so its own CPU scheduling group where the kernel groups
            # by session (autogroup): as its own container would be. In one group the workers of a
            # stack split one share of a busy machine, and a batch on one takes half the CPU an
            # interactive request on another gets (docs/benchmarks.md, the batch TTFT rows).
            start_new_session=name.startswith("worker"),
        )

    def _start_redis(self) -> None:
        if self.with_ha:
            self.ha, servers, self.settings = start_ha(self.settings, self.run_dir)
        else:
            servers, self.settings = start_redis(self.settings, self.run_dir)
        self.redis_servers.extend(servers)

    def start(self) -> None:
        self.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.run_dir.chmod(0o700)  # an older, wider one too: its logs and AOF hold prompts
        self._start_redis()
        threads = self.settings.torch_threads or max(1, (os.cpu_count() or 1) // max(1, self.num_workers))
        env = self._env = self.settings.with_overrides(torch_threads=threads).to_env()
        cli = [sys.executable, "-m", "ops.cli.main"]
        for i in range(1, self.num_workers + 1):
            self.spawn_worker(i)
        self._spawn("api", [*cli, "api"], env)
        if self.with_flower:
            self._start_flower(env)
        self._write_stack_file()

    def spawn_worker(self, i: int) -> str:
        """Start worker i (child "worker<i>", node name w<i>@host); its child's name."""
        cli = [sys.executable, "-m", "ops.cli.main", "worker", "--name", f"w{i}", "--preload"]
        self._spawn(f"worker{i}", [*cli, "--loglevel", "WARNING"], self._env)
        return f"worker{i}"

    def _start_flower(self, env: dict[str, str]) -> None:
        # Broker URL and credentials through the environment (celery's BROKER_URL, Flower's
        # FLOWER_<OPTION>), not argv. FLOWER_UNAUTHENTICATED_API never reaches it. Under Sentinel
        # the broker needs transport options too: Flower then loads our own Celery app, which
        # builds them from the KVFERRY_* settings (ops/stack/flower_app.py).
        flower_env = {**env, "FLOWER_BASIC_AUTH": f"{self.flower_user}:{self.flower_password}"}
        app: list[str] = []
        if self.settings.redis_sentinels:
            app = ["-A", "ops.stack.flower_app"]
        else:
            flower_env["BROKER_URL"] = self.settings.redis_url
        self._spawn(
            "flower",
            [
                sys.executable,
                "-m",
                "celery",
                *app,
                "flower",
                f"--port={self.settings.flower_port}",
                "--address=127.0.0.1",
            ],
            flower_env,
            drop=("FLOWER_UNAUTHENTICATED_API",),
        )

    def _write_stack_file(self) -> None:
        info = {
            "api_url": self.api_url,
            "redis_url": self.settings.queue_url,
            "redis_sentinels": self.settings.redis_sentinels,
            "redis_master": self.settings.redis_master,
            "kv_redis_url": self.kv_redis_url,
            "flower_url": self.flower_url if self.with_flower else None,
            "flower_user": self.flower_user if self.with_flower else None,
            "flower_password": self.flower_password if self.with_flower else None,
            "model": self.settings.served_model,
            "workers": self.num_workers,
            "run_dir": str(self.run_dir),
            "pid": os.getpid(),
        }
        write_private(self.stack_file, json.dumps(info, indent=2) + "\n")
        self._wrote_stack_file = True

    def _check_children(self) -> None:
        for name, child in self.children.items():
            if child.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with {child.returncode}; see {self.run_dir / (name + '.log')}"
                )

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        client = connect(self.settings.queue_url)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_children()
            ready = [w for w in live_workers(client) if w.engine is not None]
            if (
                len(ready) >= self.num_workers
                and self._http_ok(f"{self.api_url}/healthz")
                # /healthcheck is Flower's one page without auth
                and (not self.with_flower or self._http_ok(f"{self.flower_url}/healthcheck"))
            ):
                return
            time.sleep(0.5)
        raise TimeoutError(f"the stack was not ready after {timeout_s:.0f}s; logs in {self.run_dir}")

    def api_ready(self) -> bool:
        return self._http_ok(f"{self.api_url}/healthz")

    @staticmethod
    def _http_ok(url: str) -> bool:
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def banner(self) -> str:
        flower = f"{self.flower_url}   (user {self.flower_user!r}; password in stack.json)"
        return (
            f"kvferry is up: {self.num_workers} worker(s) serving {self.settings.served_model!r}\n"
            f"  API (OpenAI-compatible): {self.api_url}/v1   metrics: {self.api_url}/metrics\n"
            f"  Flower:                  {flower if self.with_flower else 'off'}\n"
            f"  Redis (queue):           {redact(self.settings.queue_url)}\n"
            f"  Redis (KV tier):         {redact(self.kv_redis_url)}\n"
            f"  URLs and secrets:        {self.stack_file} (mode 0600)\n"
            f"  logs:                    {self.run_dir}"
        )

    def wait(self, tick: Callable[[], None] | None = None) -> None:
        """Until Ctrl-C. A worker that exits (its supervisor gave up on a broken engine, or it was
        killed) is started again under its name, as compose's restart policy would; its jobs were
        handed back by the other workers' reapers, or are released by its own start. `tick`, once
        a second first: the autoscaler's (ops/scale/autoscaler.py), which reaps what it drained."""
        try:
            while True:
                if tick is not None:
                    tick()
                for name, child in list(self.children.items()):
                    if name.startswith("worker") and child.poll() is not None:
                        print(f"{name} exited with {child.returncode}; restarting it", flush=True)
                        self.restart_child(name)
                self._check_children()
                time.sleep(1)
        except KeyboardInterrupt:
            pass

    def restart_child(self, name: str) -> None:
        """SIGKILL one child and start it again, same command, same name (`kvferry chaos`)."""
        child = self.children[name]
        child.kill()
        child.wait(10)
        args, env, drop = self._specs[name]
        self._spawn(name, args, env, drop)

    def restart_queue_redis(self, down_s: float = 1.0) -> bool:
        """Stop the queue's Redis (SIGTERM: it syncs its AOF) and start it again on the same port,
        directory and password. False when the stack runs on a Redis it did not start."""
        if not self.redis_servers or self.redis_servers[0].url != self.settings.redis_url:
            return False
        server = self.redis_servers[0]
        server.stop()
        time.sleep(down_s)
        server.start()
        return True

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
        for server in reversed(self.redis_servers):
            server.stop()
        self.redis_servers.clear()
        if self.ha is not None:
            self.ha.stop()
            self.ha = None
        if self._wrote_stack_file:  # its passwords die with the servers; a stale file misleads
            self.stack_file.unlink(missing_ok=True)
            self._wrote_stack_file = False
