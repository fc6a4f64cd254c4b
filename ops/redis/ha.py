"""LocalHA: the queue Redis under Sentinel on one machine (`kvferry serve --ha`, `kvferry chaos
--failovers`, the tests): a primary, a replica and three sentinels, real redis-server processes.

One generated password guards all five: requirepass and masterauth on both data servers (either
may be the primary after a failover), auth-pass and requirepass/sentinel-pass on the sentinels.
It lives in 0600 config files, never on a command line. Sentinel's timing is set for a single
machine: a primary silent for about a second is down, and the replica is promoted a moment later.
Everything binds and announces 127.0.0.1.
"""

from __future__ import annotations

import secrets
import subprocess
import time
from pathlib import Path
from typing import Any

import redis

from ops.redis.server import RedisServer, find_redis_server, free_port, write_private

MASTER_NAME = "kvferry"
# Staggered per sentinel: three that see the primary down at the same instant all ask for votes
# at once, split them, and wait 2 x FAILOVER_TIMEOUT_MS before trying again.
DOWN_AFTER_MS = (1000, 1250, 1500)
FAILOVER_TIMEOUT_MS = 1500
QUORUM = 2


class LocalHA:
    def __init__(self, run_dir: Path, password: str | None = None, master: str = MASTER_NAME) -> None:
        self.run_dir = run_dir
        self.password = password or secrets.token_urlsafe(24)
        self.master = master
        # no diskless-sync delay: a restarted old primary is a replica again within a second
        auth = (f"masterauth {self.password}", "repl-diskless-sync-delay 0")
        self.servers = [
            RedisServer(run_dir / name, persist=True, password=self.password, config_lines=auth)
            for name in ("redis-a", "redis-b")
        ]
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.sentinels_procs: list[subprocess.Popen[bytes]] = []

    @property
    def sentinels(self) -> str:
        """KVFERRY_REDIS_SENTINELS."""
        return ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)

    @property
    def redis_url(self) -> str:
        """KVFERRY_REDIS_URL: the password and db (its host is the first primary's; unused)."""
        return self.servers[0].url

    def start(self, timeout_s: float = 20.0) -> LocalHA:
        primary, replica = self.servers
        primary.start()
        replica.config_lines = (*replica.config_lines, f"replicaof 127.0.0.1 {primary.port}")
        replica.start()
        for i, port in enumerate(self.sentinel_ports):
            self._start_sentinel(i, port, primary.port)
        self._wait_settled(timeout_s)
        return self

    def _start_sentinel(self, i: int, port: int, primary_port: int) -> None:
        data = self.run_dir / f"sentinel{i + 1}"
        data.mkdir(mode=0o700, parents=True, exist_ok=True)
        conf = data / "sentinel.conf"
        m = self.master
        write_private(
            conf,
            f"port {port}\nbind 127.0.0.1\ndir {data}\nrequirepass {self.password}\n"
            f"sentinel sentinel-pass {self.password}\n"
            f"sentinel monitor {m} 127.0.0.1 {primary_port} {QUORUM}\n"
            f"sentinel auth-pass {m} {self.password}\n"
            f"sentinel down-after-milliseconds {m} {DOWN_AFTER_MS[i]}\n"
            f"sentinel failover-timeout {m} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {m} 1\n",
        )
        log = (data / "sentinel.log").open("ab")
        args = [find_redis_server(), str(conf), "--sentinel"]
        # umask: a sentinel rewrites its config (with the password) and must not widen it
        self.sentinels_procs.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, umask=0o077))

    def _sentinel(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, password=self.password, socket_timeout=2, decode_responses=True)

    def _wait_settled(self, timeout_s: float) -> None:
        """Until every sentinel knows the primary, its replica and the two other sentinels: only
        then can they agree on a failover."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                states: list[Any] = [
                    self._sentinel(p).sentinel_master(self.master) for p in self.sentinel_ports
                ]
                known = all(int(s["num-slaves"]) >= 1 and int(s["num-other-sentinels"]) >= 2 for s in states)
                if known and self.replicas_online() >= 1:
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the sentinels did not settle; logs in {self.run_dir}")
            time.sleep(0.1)

    def primary_port(self, unanimous: bool = False) -> int:
        """The primary's port as the sentinels (a majority of those answering; unanimous: all
        three, else a RuntimeError) see it."""
        seen: list[int] = []
        for port in self.sentinel_ports:
            try:
                addr: Any = self._sentinel(port).sentinel_get_master_addr_by_name(self.master)
            except redis.RedisError:
                continue
            if addr:
                seen.append(int(addr[1]))
        if not seen or (unanimous and (len(seen) < len(self.sentinel_ports) or len(set(seen)) > 1)):
            raise RuntimeError(f"the sentinels do not agree on the primary: {seen}")
        return max(set(seen), key=seen.count)

    def replicas_online(self) -> int:
        """Replicas the primary streams to (past their initial sync)."""
        info = redis.Redis(port=self.primary_port(), password=self.password, socket_timeout=2).info(
            "replication"
        )
        return sum(
            1
            for k, v in info.items()
            if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online"
        )

    def server_on(self, port: int) -> RedisServer:
        return next(s for s in self.servers if s.port == port)

    def kill_primary(self) -> RedisServer:
        """SIGKILL the current primary; returns it (for restart_as_replica)."""
        server = self.server_on(self.primary_port())
        server.kill()
        return server

    def wait_promoted(self, old_port: int, timeout_s: float = 30.0) -> int:
        """Until the sentinels name a primary other than old_port and it accepts writes; its port."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                port = self.primary_port()
                if port != old_port:
                    client = redis.Redis(port=port, password=self.password, socket_timeout=2)
                    client.set("kvferry:ha:probe", b"1", ex=60)  # READONLY while still a replica
                    return port
            except (redis.RedisError, RuntimeError):
                pass
            time.sleep(0.05)
        raise TimeoutError(f"no replica was promoted within {timeout_s:.0f}s; logs in {self.run_dir}")

    def restart_as_replica(self, server: RedisServer, timeout_s: float = 30.0) -> None:
        """Start a killed server again as the new primary's replica (its AOF is replaced by a full
        sync) and wait until it is in sync: only then could it take over in turn. Sentinel would
        reconfigure it anyway; saying so at start keeps it from serving as a second primary.
        It starts only once every sentinel names the new primary: a sentinel still naming the old
        one would otherwise send clients to it, now a replica, as soon as it answers again."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                primary = self.primary_port(unanimous=True)
                break
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        lines = tuple(line for line in server.config_lines if not line.startswith("replicaof"))
        server.config_lines = (*lines, f"replicaof 127.0.0.1 {primary}")
        server.start()
        while self.replicas_online() < 1:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the old primary did not resync within {timeout_s:.0f}s")
            time.sleep(0.05)

    def failover(self, timeout_s: float = 30.0) -> float:
        """Kill the primary, wait for the promotion, restart the old one as a replica; the seconds
        from the kill until the new primary accepted a write."""
        killed = self.kill_primary()
        t0 = time.monotonic()
        self.wait_promoted(killed.port, timeout_s)
        took = time.monotonic() - t0
        self.restart_as_replica(killed)
        return took

    def stop(self) -> None:
        for proc in self.sentinels_procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.sentinels_procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.sentinels_procs.clear()
        for server in self.servers:
            server.stop()

    def __enter__(self) -> LocalHA:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
