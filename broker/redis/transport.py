"""kombu's Redis transports (plain and Sentinel), fixed so that a Redis restart does not end the
worker process.

When the broker connection drops, Celery 5.7's consumer collects the connection (which drops the
transport's client) and then closes it again; the tasks it is running ack later, through the
same channel. kombu's Redis channel builds a new connection pool from the transport's client for
either, finds None, and raises AttributeError: no connection error, so the consumer gives up and
the worker exits (with 0) on every Redis restart, its running jobs with it. Here a channel keeps
the connection it was opened on and builds a pool from it once the transport's client is gone
(plain URL or Sentinel), so its acks reach Redis once it is back; and its second close, after
the collect, only releases its sockets.

What the channel delivered may still be put back on its queue by the collect's own first close
(kombu restores unacked messages when Redis answers then): a copy of a running job then waits
on the job's lease and replays its result, as any redelivered copy does; nothing runs twice.

The classes replace kombu's under its own aliases (`redis`, `rediss`, `sentinel`), so that a
failover to another URL of the list, which kombu resolves again by scheme, keeps them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from kombu import transport as kombu_transport
from kombu.transport import redis as kombu_redis

FAILOVER_WAIT_S = 15.0
FAILOVER_POLL_S = 0.1


def _collected(channel: Any) -> bool:
    transport = channel.connection
    return transport is not None and getattr(transport, "client", None) is None


class Channel(kombu_redis.Channel):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # the kombu Connection this channel was opened on (collect() leaves it whole)
        self._kept_client = getattr(self.connection, "client", None)

    @contextlib.contextmanager
    def _client_back(self) -> Iterator[None]:
        """The transport's client, back for the time a pool is built, if it was collected."""
        transport = self.connection
        if not _collected(self) or self._kept_client is None:
            yield
            return
        transport.client = self._kept_client
        try:
            yield
        finally:
            transport.client = None

    def _get_pool(self, asynchronous: bool = False) -> Any:
        with self._client_back():
            return super()._get_pool(asynchronous=asynchronous)

    def close(self) -> None:
        if self.closed or not _collected(self):
            super().close()
            return
        self._closing = True
        self.closed = True
        if self._qos is not None:
            self._qos._on_collect.cancel()  # its restore at exit would fail the same way
        self._disconnect_pools()
        self._close_clients()


class SentinelChannel(Channel, kombu_redis.SentinelChannel):
    pass


class Transport(kombu_redis.Transport):
    Channel = Channel


class SentinelTransport(kombu_redis.SentinelTransport):
    """A connection made while the sentinels still name a dead primary (a failover under way)
    is tried again every FAILOVER_POLL_S for up to FAILOVER_WAIT_S, asking the sentinels anew
    each time: the worker's consumer then takes jobs again as soon as the replica is promoted,
    not after Celery's reconnect backoff (2 s, then 4 s, ...) on top of it."""

    Channel = SentinelChannel

    def establish_connection(self) -> Any:
        deadline = time.monotonic() + FAILOVER_WAIT_S
        while True:
            try:
                return super().establish_connection()
            except self.connection_errors:
                if time.monotonic() > deadline:
                    raise
                time.sleep(FAILOVER_POLL_S)


ALIASES = {
    "redis": f"{__name__}:Transport",
    "rediss": f"{__name__}:Transport",
    "sentinel": f"{__name__}:SentinelTransport",
}


def install() -> None:
    """Serve kombu's Redis aliases with these classes (idempotent; before any connection)."""
    kombu_transport.TRANSPORT_ALIASES.update(ALIASES)
    for alias in ALIASES:
        kombu_transport._transport_cache.pop(alias, None)


install()
