"""`kvferry serve --ha`'s Redis: a primary, a replica and three sentinels with one generated
password (in 0600 config files, on no command line), the KV Redis with a secret of its own, and
settings that point every client at the sentinels."""

from __future__ import annotations

import stat
from pathlib import Path

from broker.redis.connect import connect, is_sentinel
from ops.settings import Settings
from ops.stack.redis import HA_LEASE_TTL_S, start_ha


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def test_serve_ha_redis_is_sentinel_managed_and_secret(tmp_path: Path) -> None:
    ha, servers, settings = start_ha(Settings(cache_dir=tmp_path), tmp_path)
    try:
        assert is_sentinel(settings.queue_url) and settings.redis_master == ha.master
        assert settings.redis_sentinels == ha.sentinels and len(ha.sentinel_ports) == 3
        assert settings.job_lease_ttl_s == HA_LEASE_TTL_S  # a lease outlives a failover
        assert settings.broker_config().lease_ttl_s == HA_LEASE_TTL_S
        client = connect(settings.queue_url)
        client.set("kvferry:test:ha", b"1")
        assert client.execute_command("WAIT", 1, 2000) == 1  # the replica follows
        assert settings.kv_redis_url == servers[0].url and servers[0].password != ha.password
        pids = [s.process.pid for s in [*ha.servers, *servers] if s.process] + [
            p.pid for p in ha.sentinels_procs
        ]
        assert len(pids) == 6
        for pid in pids:
            line = _cmdline(pid)
            assert ha.password not in line and str(servers[0].password) not in line
        ha.failover()  # the sentinels rewrite their configs, and the promoted replica's
        assert client.get("kvferry:test:ha") == b"1"
        for conf in tmp_path.rglob("*.conf"):
            assert stat.S_IMODE(conf.stat().st_mode) == 0o600, conf
    finally:
        for server in servers:
            server.stop()
        ha.stop()
