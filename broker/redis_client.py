"""Redis clients for the worker side: commands ride out a Redis restart (AOF replay, failover)
instead of failing the job that sent them. A stream append retried after its reply was lost
appends nothing twice: the fenced script refuses what the stream holds (broker/jobs/events.py)."""

from __future__ import annotations

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

RESTART_RETRIES = 40  # with the backoff below: about 30 s of retrying before an error surfaces


def connect(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), RESTART_RETRIES))
