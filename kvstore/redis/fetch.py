"""PackFetcher: reads packs from the Redis tier in MGETs of a few MB, the next ones on the wire
while the caller decodes this one's packs. On a Redis Cluster each "MGET" is a pipelined run of
GETs per node, the nodes in parallel (kvstore/redis/cluster_fetch.py)."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from kvstore.redis.bulk_mget import bulk_mget
from kvstore.redis.client import KVClient, is_cluster
from kvstore.redis.cluster_fetch import ClusterGets

T = TypeVar("T")
# Per MGET: one huge reply would hold Redis (and the job queue) longer, and the read path decodes
# one MGET's packs while the next is on the wire: a few MB keeps both sides busy (docs/benchmarks.md).
_MAX_MGET_BYTES = 4 * 1024**2
# MGETs in flight, each on a helper thread of its own with its own connection: while one reply
# is on the wire, Redis already builds the next one; a third in flight adds nothing on two cores
# (docs/benchmarks.md).
AHEAD = 2


class PackFetcher:
    def __init__(self, client: KVClient, pack_bytes: int) -> None:
        """``pack_bytes``: the largest pack, as stored (blocks_per_pack blocks)."""
        self.client = client
        self.cluster = ClusterGets(client) if is_cluster(client) else None
        self.pack_bytes = pack_bytes
        self._lock = threading.Lock()  # guards the helper threads' lazy start: readers share a tier
        self._executor: ThreadPoolExecutor | None = None  # fetches the next MGETs while one decodes

    @property
    def fetched_ahead(self) -> bool:
        """Whether a read has needed several MGETs (so the helper threads have started)."""
        return self._executor is not None

    def stream(self, pack_keys: list[bytes]) -> Generator[tuple[bytes, memoryview | None]]:
        """(key, value or None) of every pack, in order: MGETs of a few MB, the next AHEAD fetched
        on helper threads while the caller decodes this one's packs (socket reads, checksums and
        copies release the GIL, so they overlap on two cores)."""
        chunks = batched(pack_keys, max(1, _MAX_MGET_BYTES // self.pack_bytes))
        if len(chunks) <= 1:
            values = self.mget(chunks[0]) if chunks else []
            yield from zip(pack_keys, values, strict=True)
            return
        if self._executor is None:
            with self._lock:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(AHEAD, thread_name_prefix="kv-tier-fetch")
        executor = self._executor
        ahead = deque(executor.submit(self.mget, c) for c in chunks[:AHEAD])
        for i, chunk in enumerate(chunks):
            values = ahead.popleft().result()
            if i + AHEAD < len(chunks):  # a run cut short leaves these to finish unread
                ahead.append(executor.submit(self.mget, chunks[i + AHEAD]))
            yield from zip(chunk, values, strict=True)

    def mget(self, keys: Sequence[bytes]) -> list[memoryview | None]:
        """One MGET, on the calling thread: each value received into a buffer of its own."""
        if self.cluster is not None:
            return self.cluster.mget(keys)
        return bulk_mget(self.client, keys)  # type: ignore[arg-type]  # a plain client here


def batched(items: Sequence[T], n: int) -> list[Sequence[T]]:
    return [items[i : i + n] for i in range(0, len(items), n)]
