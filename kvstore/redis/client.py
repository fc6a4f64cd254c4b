"""kv_client: the KV tier's Redis client, from KVFERRY_KV_REDIS_URL; every KV client is made here.

A plain ``redis://`` (or ``rediss://``, ``unix://``) URL gives a redis.Redis that rides out a
restart (broker/redis/client.py). ``redis+cluster://[[user]:password@]host:port,host:port,...``
names a Redis Cluster (any of its nodes will do; more of them help when one is down): it gives
redis-py's own cluster client (redis.cluster.RedisCluster), which routes each key to its shard.

A cluster client fails fast: a shard that is down costs a read misses, a write a drop (the KV
writer counts it), never a job's wait; so its connect timeout is short and it retries a command
once, after refreshing the slot map (a shard that moved, not one that died).
"""

from __future__ import annotations

from typing import Any, TypeGuard
from urllib.parse import unquote

import redis
from redis.backoff import ConstantBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from broker.redis import client as redis_client

CLUSTER_SCHEME = "redis+cluster://"
CONNECT_TIMEOUT_S = 0.25  # a dead shard's host: a connect fails within this
SOCKET_TIMEOUT_S = 5.0  # a shard that stops answering mid-reply (a reply of a few MB takes ms)
CLUSTER_RETRIES = 1

KVClient = redis.Redis | RedisCluster
# What a KV operation may raise when a shard or the whole KV Redis is away: redis-py's cluster
# client raises RedisClusterException (e.g. SlotNotCoveredError), which is no RedisError.
KV_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, RedisClusterException, OSError)


def is_cluster(client: Any) -> TypeGuard[RedisCluster]:
    return isinstance(client, RedisCluster)


def kv_client(url: str) -> KVClient:
    """The client for ``url``: a RedisCluster for redis+cluster://, else a plain redis.Redis."""
    if not url.startswith(CLUSTER_SCHEME):
        return redis_client.connect(url)
    username, password, nodes = parse_cluster_url(url)
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in nodes],
        username=username,
        password=password,
        decode_responses=False,
        require_full_coverage=False,
        retry=Retry(ConstantBackoff(0.05), CLUSTER_RETRIES),
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=SOCKET_TIMEOUT_S,
    )


def parse_cluster_url(url: str) -> tuple[str | None, str | None, list[tuple[str, int]]]:
    """(username, password, [(host, port), ...]) of a redis+cluster:// URL; ValueError if malformed."""
    if not url.startswith(CLUSTER_SCHEME):
        raise ValueError(f"not a {CLUSTER_SCHEME} URL")
    rest = url[len(CLUSTER_SCHEME) :].rstrip("/")
    auth, at, hosts = rest.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = auth.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    nodes: list[tuple[str, int]] = []
    for part in hosts.split(","):
        host, colon, port = part.strip().rpartition(":")
        if not colon or not host or not port.isdigit():
            raise ValueError(f"{CLUSTER_SCHEME} URL: {part!r} is not host:port")
        nodes.append((host.strip("[]"), int(port)))
    return username, password, nodes
