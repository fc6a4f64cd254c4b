"""The queue Redis's address, one string for every client: a plain `redis://` URL, or under
Sentinel a `redis+sentinel://:password@h1:p1,h2:p2,h3:p3/db?master=name` address, which this
module alone reads. From it come the sync and asyncio redis-py clients (Sentinel's master_for:
they ask the sentinels for the primary again after a failover) and Celery's broker and result
backend URLs with their transport options (kombu's `sentinel://` transport, Celery's
SentinelBackend). A plain URL gives exactly the clients it gave before.

The sentinels take the data password (sentinel_kwargs): they guard the queue Redis and hand out
its address, so a secret of their own would protect nothing the data password does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelManagedConnection as AsyncSentinelConnection
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelManagedConnection

SCHEME = "redis+sentinel"
RESTART_RETRIES = 40  # with the backoff below: about 30 s of retrying before an error surfaces


def backoff() -> ExponentialBackoff:
    return ExponentialBackoff(cap=1.0, base=0.05)


@dataclass(frozen=True, slots=True)
class SentinelAddress:
    sentinels: tuple[tuple[str, int], ...]
    master: str
    password: str | None = None
    db: int = 0


def parse_sentinels(text: str) -> tuple[tuple[str, int], ...]:
    """'h:p,h:p' -> ((h, p), ...); a clear ValueError for anything else."""
    found = []
    for item in (part.strip() for part in text.split(",")):
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"not host:port: {item!r} (expected 'h:p,h:p,h:p')")
        found.append((host, int(port)))
    if not found:
        raise ValueError("no sentinels given")
    return tuple(found)


def queue_address(redis_url: str, sentinels: str | None, master: str | None) -> str:
    """The address for the settings: `redis_url` as it is without sentinels; with them, the
    sentinel address with redis_url's password and db (its host and port are not used)."""
    if not sentinels:
        return redis_url
    if not master:
        raise ValueError("KVFERRY_REDIS_SENTINELS needs KVFERRY_REDIS_MASTER (the master's name)")
    parts = urlsplit(redis_url)
    db = parts.path.strip("/") or "0"
    auth = f":{quote(unquote(parts.password), safe='')}@" if parts.password else ""
    hosts = ",".join(f"{h}:{p}" for h, p in parse_sentinels(sentinels))
    return f"{SCHEME}://{auth}{hosts}/{db}?master={quote(master, safe='')}"


def parse(address: str) -> SentinelAddress | None:
    """The sentinel address's parts; None for a plain Redis URL."""
    if not address.startswith(SCHEME + "://"):
        return None
    rest = address[len(SCHEME) + 3 :]
    auth, _, rest = rest.rpartition("@")
    hosts, _, tail = rest.partition("/")
    path, _, query = tail.partition("?")
    master = parse_qs(query).get("master", [""])[0]
    if not master:
        raise ValueError("a redis+sentinel address needs ?master=<name>")
    password = unquote(auth.partition(":")[2]) if auth else None
    return SentinelAddress(parse_sentinels(hosts), master, password or None, int(path or 0))


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
    timeouts = {k: kwargs[k] for k in ("socket_timeout", "socket_connect_timeout") if k in kwargs}
    sentinel = Sentinel(list(found.sentinels), sentinel_kwargs=_sentinel_kwargs(found, **timeouts))
    kwargs.setdefault("connection_class", _FollowingConnection)
    return sentinel.master_for(found.master, password=found.password, db=found.db, **kwargs)


def connect_async(address: str, retry: bool | None = None, **kwargs: Any) -> aioredis.Redis:
    """An asyncio client (the api's), retrying as connect() does."""
    found = parse(address)
    if retry or (retry is None and found is not None):
        kwargs.setdefault("retry", AsyncRetry(backoff(), RESTART_RETRIES))
    if found is None:
        return aioredis.Redis.from_url(address, **kwargs)
    timeouts = {k: kwargs[k] for k in ("socket_timeout", "socket_connect_timeout") if k in kwargs}
    sentinel = AsyncSentinel(list(found.sentinels), sentinel_kwargs=_sentinel_kwargs(found, **timeouts))
    kwargs.setdefault("connection_class", _AsyncFollowingConnection)
    return sentinel.master_for(found.master, password=found.password, db=found.db, **kwargs)


def celery_url(address: str) -> str:
    """Celery's broker / result backend URL: kombu's `sentinel://:pw@h:p/db;sentinel://...`."""
    found = parse(address)
    if found is None:
        return address
    auth = f":{quote(found.password, safe='')}@" if found.password else ""
    return ";".join(f"sentinel://{auth}{h}:{p}/{found.db}" for h, p in found.sentinels)


def transport_options(address: str) -> dict[str, Any]:
    """What kombu's Sentinel transport and Celery's SentinelBackend need besides the URL."""
    found = parse(address)
    if found is None:
        return {}
    options: dict[str, Any] = {"master_name": found.master}
    if found.password:
        options["sentinel_kwargs"] = {"password": found.password}
    return options


def is_sentinel(address: str) -> bool:
    return parse(address) is not None
