"""kombu's Redis transports (plain and Sentinel), fixed so that a Redis restart does not end the
worker process.

When the broker connection drops, Celery 5.7's consumer collects the connection (which drops the
transport's client) and then closes it again; the tasks it is running ack later, through the
same channel. kombu's Redis channel builds a new connection pool from the transport's client for
either, finds None, and raises AttributeError: no connection error, so the consumer gives up and
the worker exits (with 0) on every Redis restart, its running jobs with it. Here a channel keeps
the connection parameters it last had, so its acks reach Redis once it is back, and its close
after a collect only releases its sockets: what it delivered is running in this process, and
acks as it ends (or the reaper hands it back if this process dies), so nothing is put back on
the queue to run twice.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis

# what make_celery() names as broker_transport for each URL scheme
BY_SCHEME = {
    "redis": f"{__name__}:Transport",
    "rediss": f"{__name__}:Transport",
    "sentinel": f"{__name__}:SentinelTransport",
}


def _collected(channel: Any) -> bool:
    transport = channel.connection
    return transport is not None and getattr(transport, "client", None) is None


class Channel(kombu_redis.Channel):
    _kept_params: dict[bool, dict[str, Any]]

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        kept = self.__dict__.setdefault("_kept_params", {})
        if _collected(self) and asynchronous in kept:
            return dict(kept[asynchronous])
        params: dict[str, Any] = super()._connparams(asynchronous=asynchronous)
        kept[asynchronous] = dict(params)
        return params

    def close(self) -> None:
        if self.closed or not _collected(self):
            super().close()
            return
        self._closing = True
        self.closed = True
        if self._qos is not None:
            self._qos._on_collect.cancel()  # nothing to put back at exit either (see above)
        self._disconnect_pools()
        self._close_clients()


class SentinelChannel(Channel, kombu_redis.SentinelChannel):
    pass


class Transport(kombu_redis.Transport):
    Channel = Channel


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel


def transport_for(url: str) -> str | None:
    """The broker_transport for a broker URL (None: kombu's own choice, for other schemes)."""
    first = url.split(";", 1)[0]
    scheme = first.split("://", 1)[0].lower() if "://" in first else ""
    return BY_SCHEME.get(scheme)
