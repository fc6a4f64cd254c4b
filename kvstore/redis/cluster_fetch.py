"""ClusterGets: the packs of one read from a Redis Cluster, each node's fetched by a pipelined
run of GETs on that node's own connection (an MGET there would need every key in one slot, and
packs are spread over all of them), the nodes in parallel: one run per node in flight at once,
the first on the calling thread, the others on helper threads. Values are received as bulk_mget
receives them: straight into buffers of their own, one copy.

A node that is down reads as misses (None), never an error: the engine computes those blocks. A
reply that says the key moved (MOVED, ASK: the slot map changed) is asked again through redis-py's
cluster client, which follows the redirection and refreshes its map; so is the first key of a
node that did not answer, once (a promoted replica now serves it). A node found down is not
asked again for DOWN_S: its packs read as misses at once, so a dead shard costs one read its
connect timeout, not every read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import redis
from redis.cluster import RedisCluster

from kvstore.redis import nodes
from kvstore.redis.bulk_mget import read_gets
from kvstore.redis.client import KV_ERRORS

log = logging.getLogger(__name__)
MAX_NODES_IN_FLIGHT = 8
DOWN_S = 5.0  # a node that failed is left alone this long (a restarted shard serves again after it)


class ClusterGets:
    def __init__(self, client: RedisCluster) -> None:
        self.client = client
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self.node_failures = 0  # node runs that found the node down (its packs read as misses)
        self._down_until: dict[str, float] = {}  # node name -> when to try it again

    def mget(self, keys: Sequence[bytes]) -> list[memoryview | None]:
        values: list[memoryview | None] = [None] * len(keys)
        groups = list(nodes.by_node(self.client, keys).items())
        if not groups:
            return values
        others = groups[1:]
        futures = [self._pool().submit(self._node_gets, name, [keys[i] for i in at]) for name, at in others]
        name, at = groups[0]
        for i, value in zip(at, self._node_gets(name, [keys[i] for i in at]), strict=True):
            values[i] = value
        for (_, at), future in zip(others, futures, strict=True):
            for i, value in zip(at, future.result(), strict=True):
                values[i] = value
        return values

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            with self._lock:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(
                        MAX_NODES_IN_FLIGHT, thread_name_prefix="kv-tier-node"
                    )
        return self._executor

    def _node_gets(self, name: str, keys: list[bytes]) -> list[memoryview | None]:
        if time.monotonic() < self._down_until.get(name, 0.0):
            return [None] * len(keys)
        conn = None
        try:
            node = self.client.get_node(node_name=name)
            if node is None:  # gone from the slot map since the keys were grouped
                return [self._via_cluster(k) for k in keys]
            pool = self.client.get_redis_connection(node).connection_pool
            conn = pool.get_connection()
            replies = read_gets(conn, keys)
        except (OSError, redis.ConnectionError, redis.TimeoutError) as exc:
            if conn is not None:
                conn.disconnect()  # half-read: never back in the pool in this state
                pool.release(conn)
            return self._node_down(name, keys, exc)
        except BaseException:
            if conn is not None:
                conn.disconnect()
                pool.release(conn)
            raise
        pool.release(conn)
        return [
            self._via_cluster(k) if isinstance(r, redis.RedisError) else r
            for k, r in zip(keys, replies, strict=True)
        ]

    def _node_down(self, name: str, keys: list[bytes], exc: Exception) -> list[memoryview | None]:
        """Its packs are misses, unless the cluster client finds the first one elsewhere now."""
        self.node_failures += 1
        first = self._via_cluster(keys[0])
        if first is None:
            log.warning("KV shard %s is down: its packs read as misses for %g s (%s)", name, DOWN_S, exc)
            self._down_until[name] = time.monotonic() + DOWN_S
            return [None] * len(keys)
        return [first, *(self._via_cluster(k) for k in keys[1:])]

    def _via_cluster(self, key: bytes) -> memoryview | None:
        try:
            value = self.client.get(key)
        except KV_ERRORS:
            return None
        return None if value is None else memoryview(cast("bytes", value))
