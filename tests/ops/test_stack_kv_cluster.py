"""`kvferry serve --kv-shards 3`: the stack's KV tier on a real local Redis Cluster, reached
through the redis+cluster:// URL it hands the workers; `kvferry stats` reads it."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from kvstore.redis.client import kv_client
from ops.queue_client import redis_tier_report
from ops.redis.cluster import LocalCluster
from ops.settings import Settings
from ops.stack.redis import start_redis


def test_serve_with_kv_shards_starts_a_cluster(tmp_path: Path) -> None:
    servers, settings = start_redis(Settings(kv_shards=3, redis_cache_size=64 * 2**20), tmp_path)
    try:
        cluster = servers[1]
        assert len(servers) == 2 and isinstance(cluster, LocalCluster)
        assert settings.kv_redis_url is not None and settings.kv_redis_url.startswith("redis+cluster://")
        kv = kv_client(settings.kv_redis_url)
        assert isinstance(kv, RedisCluster) and len(kv.get_primaries()) == 3
        for i in range(3):  # each shard evicts packs only, within its share of the cap
            config = cluster.node(i).config_get("maxmemory*")
            assert config["maxmemory-policy"] == "volatile-lru"
            assert 64 * 2**20 // 3 < int(config["maxmemory"]) < 64 * 2**20 + 64 * 2**20
        assert redis_tier_report(settings)["packs"] == 0  # `kvferry stats`
        for process in cluster.processes:  # the password is in a 0600 file, never on a command line
            assert process is not None
            assert cluster.password not in Path(f"/proc/{process.pid}/cmdline").read_text()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=cluster.ports[0], retry=Retry(NoBackoff(), 0)).ping()
    finally:
        for server in servers:
            server.stop()
