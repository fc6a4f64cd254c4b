"""The queue Redis's clients from its address (broker/redis/sentinel_address.py: a plain `redis://` URL,
or under Sentinel a `redis+sentinel://` address): sync and asyncio redis-py clients, which under
Sentinel (master_for) ask the sentinels for the primary again after a failover. A plain URL gives
exactly the clients it gave before. Celery's URLs and transport options are re-exported here.

The sentinels take the data password (sentinel_kwargs): they guard the queue Redis and hand out
its address, so a secret of their own would protect nothing the data password does not.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelManagedConnection as AsyncSentinelConnection
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelManagedConnection

from broker.redis.sentinel_address import (
    SentinelAddress,
    celery_url,
    is_sentinel,
    parse,
    queue_address,
    transport_options,
)

__all__ = [
    "celery_url",
    "connect",
    "connect_async",
    "is_sentinel",
    "parse",
    "queue_address",
    "transport_options",
]
RESTART_RETRIES = 40  # with the backoff below: about 30 s of retrying before an error surfaces


def backoff() -> ExponentialBackoff:
    return ExponentialBackoff(cap=1.0, base=0.05)


class _FollowingConnection(SentinelManagedConnection):
    """redis-py 8.1 reconnects a dropped connection inside a command's retry through
    connect_check_health, past the sentinel lookup of connect(): the retries then all go to the
    dead (or demoted) primary's address. Here every fresh connect asks the sentinels first."""

    def connect_check_health(self, check_health: bool = True, retry_socket_connect: bool = True) -> None:
        if self._sock is None and self.connection_pool.is_master:
            self.host, self.port = self.connection_pool.get_master_address()
        super().connect_check_health(check_health=check_health, retry_socket_connect=retry_socket_connect)


class _AsyncFollowingConnection(AsyncSentinelConnection):
    """_FollowingConnection for redis.asyncio."""

    async def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        if not self.is_connected and self.connection_pool.is_master:
            self.host, self.port = await self.connection_pool.get_master_address()
        await super().connect_check_health(
            check_health=check_health, retry_socket_connect=retry_socket_connect
        )


def _sentinel_kwargs(address: SentinelAddress, **connection: Any) -> dict[str, Any]:
    return {"password": address.password, **connection} if address.password else dict(connection)


def connect(address: str, retry: bool | None = None, **kwargs: Any) -> redis.Redis:
    """A sync client; retry=True: commands ride out a restart or failover (about 30 s); None:
    under Sentinel only (a plain URL then gives redis-py's default client, as before)."""
    found = parse(address)
    if retry or (retry is None and found is not None):
        kwargs.setdefault("retry", Retry(backoff(), RESTART_RETRIES))
    if found is None:
        return redis.Redis.from_url(address, **kwargs)
    return _master(Sentinel, _FollowingConnection, found, kwargs)


def connect_async(address: str, retry: bool | None = None, **kwargs: Any) -> aioredis.Redis:
    """An asyncio client (the api's), retrying as connect() does."""
    found = parse(address)
    if retry or (retry is None and found is not None):
        kwargs.setdefault("retry", AsyncRetry(backoff(), RESTART_RETRIES))
    if found is None:
        return aioredis.Redis.from_url(address, **kwargs)
    return _master(AsyncSentinel, _AsyncFollowingConnection, found, kwargs)


def _master(
    sentinel_class: Any, connection_class: Any, found: SentinelAddress, kwargs: dict[str, Any]
) -> Any:
    """The client of the master the sentinels name, asking them again on every reconnect."""
    timeouts = {k: kwargs[k] for k in ("socket_timeout", "socket_connect_timeout") if k in kwargs}
    sentinel = sentinel_class(list(found.sentinels), sentinel_kwargs=_sentinel_kwargs(found, **timeouts))
    kwargs.setdefault("connection_class", connection_class)
    return sentinel.master_for(found.master, password=found.password, db=found.db, **kwargs)
