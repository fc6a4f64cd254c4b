"""The stack's own Redis servers: the queue's (noeviction, AOF: jobs survive a restart) and the
KV tier's (capped, evicting, no persistence: a cache), each with a generated password. With
``kv_shards`` > 0 the KV tier gets a local Redis Cluster of that many primaries instead
(ops/redis/cluster.py), each capped at its share of the tier's cap plus headroom."""

from __future__ import annotations

import secrets
from pathlib import Path

from ops.redis.cluster import LocalCluster
from ops.redis.ha import LocalHA
from ops.redis.server import RedisServer
from ops.settings import DEFAULT_REDIS_URL, Settings

# The KV Redis evicts only keys with a TTL: the tier's block packs carry one, its index, LRU, byte
# counter and pins none, so Redis may drop a pack (the tier reads that as a miss) but never the
# bookkeeping that tells which packs exist. allkeys-lru could evict the index itself.
KV_EVICTION_POLICY = "volatile-lru"
# Under Sentinel a running job's lease must outlast a failover (the primary's detection, the
# promotion, the clients' reconnect), or every job running then is stopped and redelivered.
HA_LEASE_TTL_S = 6.0


def kv_maxmemory(redis_cache_bytes: int) -> int:
    """The KV Redis's cap: a little above the tier's own byte cap, which counts pack bytes only
    (not the index, key overhead, allocator slack), so Redis evicts only when the tier's LRU lags."""
    return int(redis_cache_bytes * 1.1) + 64 * 1024**2


def start_redis(settings: Settings, run_dir: Path) -> tuple[list[RedisServer | LocalCluster], Settings]:
    """Our own Redis servers unless the settings give URLs; returns them (started) and the settings
    pointing at the Redis to use. A user's KVFERRY_REDIS_URL without a KV URL: the tier shares it."""
    servers: list[RedisServer | LocalCluster] = []
    queue_url = settings.redis_url
    own = queue_url == DEFAULT_REDIS_URL  # no Redis given: bring our own
    if own:
        queue = RedisServer(run_dir / "redis", persist=True, password=secrets.token_urlsafe(24))
        servers.append(queue.start())
        queue_url = queue.url
    try:
        kv_url = _start_kv(settings, run_dir, own, servers)
    except BaseException:
        for server in reversed(servers):
            server.stop()
        raise
    return servers, settings.with_overrides(redis_url=queue_url, kv_redis_url=kv_url or queue_url)


def _start_kv(
    settings: Settings, run_dir: Path, own: bool, servers: list[RedisServer | LocalCluster]
) -> str | None:
    """The KV tier's own Redis (a cache: capped, evicting, no persistence, its own secret) or local
    Redis Cluster (--kv-shards), unless a URL is given; appended to `servers`; its URL."""
    kv_url = settings.kv_redis_url
    cap = int(settings.redis_cache_size)
    if kv_url is not None or cap <= 0:
        return kv_url
    if settings.kv_shards > 0:
        # packs spread unevenly over the shards: each may hold a quarter more than its share
        share = kv_maxmemory(cap * 5 // 4 // settings.kv_shards)
        cluster = LocalCluster(
            run_dir / "kv-cluster", settings.kv_shards, maxmemory_bytes=share, policy=KV_EVICTION_POLICY
        )
        servers.append(cluster.start())
        return cluster.url
    if not own:
        return None
    kv = RedisServer(
        run_dir / "kv-redis",
        password=secrets.token_urlsafe(24),
        maxmemory_bytes=kv_maxmemory(cap),
        policy=KV_EVICTION_POLICY,
    )
    servers.append(kv.start())
    return kv.url


def start_ha(settings: Settings, run_dir: Path) -> tuple[LocalHA, list[RedisServer | LocalCluster], Settings]:
    """`serve --ha`: the queue Redis as a primary, a replica and three sentinels (ops/redis/ha.py),
    and the KV tier's own Redis or cluster (a cache: no failover) unless one is given; returns
    them (started) and the settings pointing every client at the sentinels."""
    ha = LocalHA(run_dir / "queue-ha").start()
    servers: list[RedisServer | LocalCluster] = []
    try:
        kv_url = _start_kv(settings, run_dir, True, servers)
    except BaseException:
        ha.stop()
        raise
    queue = settings.with_overrides(
        redis_url=ha.redis_url,
        redis_sentinels=ha.sentinels,
        redis_master=ha.master,
        job_lease_ttl_s=settings.job_lease_ttl_s or HA_LEASE_TTL_S,
    )
    return ha, servers, queue.with_overrides(kv_redis_url=kv_url or queue.queue_url)
