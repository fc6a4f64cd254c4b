"""What following or queueing a job raises, and which errors mean the queue service is down."""

from __future__ import annotations

import redis.asyncio as aioredis
from kombu.exceptions import OperationalError

from broker.errors import KvferryError


class BrokerUnavailableError(KvferryError):
    """The job could not be queued (HTTP 503); nothing about it was kept."""


class JobTimeoutError(KvferryError, TimeoutError):
    """The job produced no final event in time (HTTP 504)."""


class ClientGoneError(KvferryError):
    """The HTTP client went away while its job ran."""


# What a queue service that is down (or restarting) raises here: Redis', kombu's and the socket's
# errors. Anything else (a CodecError, say) is a bug of ours: a 500, never "unavailable".
UNAVAILABLE: tuple[type[Exception], ...] = (
    aioredis.RedisError,
    OperationalError,
    OSError,
    BrokerUnavailableError,
)
