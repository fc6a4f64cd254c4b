"""A local redis-server for `kvferry serve` and the tests (which binary: ops/redis/binary.py)."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import time
from pathlib import Path

import redis

from ops.redis.binary import find_redis_server

__all__ = ["RedisServer", "find_redis_server", "free_port", "free_port_pair", "write_private"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_pair(offset: int) -> int:
    """A free port whose port + offset is free too (Redis < 7 puts a node's cluster bus at its
    port + 10000). Drawn below the kernel's ephemeral range, so neither is some client's
    outgoing port, and both fit under 65536."""
    for _ in range(200):
        port = random.randint(15000, 32767 - offset)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + offset))
            return port
        except OSError:
            continue
    raise RuntimeError(f"no free port with a free port {offset} above it")


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read, never readable by others even for a moment: a fresh
    file created 0600 (O_EXCL, so an existing wider one is never reused), then renamed over path."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class RedisServer:
    """A redis-server child process. persist=True turns on AOF in data_dir (survives restarts).

    maxmemory_bytes > 0 caps its memory, evicting by ``policy`` (the queue's Redis keeps the
    default, noeviction: a queued job is never dropped). The password goes in a 0600 config file,
    not the command line, which any local user can read in `ps`."""

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        persist: bool = False,
        password: str | None = None,
        maxmemory_bytes: int = 0,
        policy: str = "noeviction",
        config_lines: tuple[str, ...] = (),
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.persist = persist
        self.password = password
        self.maxmemory_bytes = maxmemory_bytes
        self.policy = policy
        self.config_lines = config_lines  # more of redis.conf (ops/redis/ha.py: masterauth, replicaof)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.data_dir.chmod(0o700)
        config = self.data_dir / "redis.conf"
        lines = [f"requirepass {self.password}"] if self.password else []
        write_private(config, "".join(f"{line}\n" for line in [*lines, *self.config_lines]))
        args = [
            find_redis_server(),
            str(config),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.data_dir),
            "--save",
            "",
            "--appendonly",
            "yes" if self.persist else "no",
            "--maxmemory",
            str(self.maxmemory_bytes),
            "--maxmemory-policy",
            self.policy,
        ]
        log = (self.data_dir / "redis.log").open("ab")
        # umask: a CONFIG REWRITE (Sentinel sends one on a failover) keeps the config 0600
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, umask=0o077)
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"redis-server did not start; see {self.data_dir / 'redis.log'}"
                    ) from None
                time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: no AOF sync, no goodbye to replicas or sentinels (what a crash looks like)."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.process = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
