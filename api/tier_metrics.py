"""The Redis KV tier's report (kvstore/redis/report.py) for /metrics: its counters, what it stores
and its pins per tenant. The report is read with blocking clients, on a worker thread."""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio
import redis

from api.config import ApiConfig

log = logging.getLogger(__name__)


REPORT_MAX_AGE_S = 10.0  # scrapes within this share one read: /metrics cannot be used to load Redis


class TierReader:
    def __init__(self, config: ApiConfig) -> None:
        self.config = config
        self._clients: tuple[redis.Redis, redis.Redis] | None = None
        self._cached: tuple[float, dict[str, Any]] | None = None

    def _read(self) -> dict[str, Any]:
        from kvstore.redis.report import read_report  # torch-free, but only needed at scrape time

        if self._clients is None:
            queue = redis.Redis.from_url(self.config.redis_url, socket_timeout=5)
            kv = (
                redis.Redis.from_url(self.config.kv_redis_url, socket_timeout=5)
                if self.config.kv_redis_url
                else queue
            )
            self._clients = (kv, queue)
        return read_report(*self._clients)

    async def report(self) -> dict[str, Any] | None:
        """None when the KV Redis cannot be read: /metrics still answers with the rest."""
        now = time.monotonic()
        if self._cached is not None and now - self._cached[0] < REPORT_MAX_AGE_S:
            return self._cached[1]
        try:
            report = await anyio.to_thread.run_sync(self._read)
        except (redis.RedisError, OSError) as exc:
            log.warning("no Redis tier figures: %s", exc)
            return None
        self._cached = (now, report)
        return report

    def close(self) -> None:
        if self._clients is not None:
            for client in set(self._clients):
                client.close()
