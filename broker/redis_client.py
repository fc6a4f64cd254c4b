"""Redis clients for the worker side: commands ride out a Redis restart (AOF replay, failover)
instead of failing the job that sent them. Retrying an XADD whose reply was lost may append an
event twice; events carry their token index and epoch, so readers drop the copy."""

from __future__ import annotations

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

RESTART_RETRIES = 40  # with the backoff below: about 30 s of retrying before an error surfaces


def connect(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), RESTART_RETRIES))
