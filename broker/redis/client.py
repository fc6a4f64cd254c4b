"""Redis clients for the worker side: commands ride out a Redis restart (AOF replay, failover)
instead of failing the job that sent them. A stream append retried after its reply was lost
appends nothing twice: the fenced script refuses what the stream holds (broker/jobs/events.py). `url` may be a
Sentinel address (broker/redis/connect.py): the client then follows a failover."""

from __future__ import annotations

import redis

from broker.redis.connect import RESTART_RETRIES
from broker.redis.connect import connect as _connect

__all__ = ["RESTART_RETRIES", "connect"]


def connect(url: str) -> redis.Redis:
    return _connect(url, retry=True)
