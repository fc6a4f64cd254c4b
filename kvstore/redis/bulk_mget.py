"""bulk_mget: an MGET whose values are received straight into buffers of their own.

redis-py (with hiredis) copies a reply three times: socket -> its read buffer -> hiredis's buffer
-> a bytes object, the last two with the GIL held. The tier's packs are megabytes each, so here the
reply's bulk strings go from the socket into one numpy buffer per value (``recv_into``, the GIL
released), and the values are memoryviews of those buffers: one copy, no allocation that is zeroed
first. Only this one reply shape is read by hand (an array of bulk strings and nulls, RESP2 or
RESP3); everything else (connecting, sending, the connection pool, retries, errors) stays
redis-py's. A connection that fails mid-reply is disconnected (never reused half-read), and the
MGET is retried once through redis-py, with its own retry policy; so is one that Redis answers
with an error redis-py retries (LOADING, while it replays its file after a restart).

The redis-py internals it reads (Connection._sock, redis._parsers.BaseParser.parse_error, the
pool's cache and argument-free get_connection) are checked by tests/kvstore/test_redis_internals.py;
pyproject.toml pins redis-py to the versions that pass it.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import cast

import numpy as np
import redis
from redis._parsers import BaseParser
from redis.connection import AbstractConnection

_LINE_READ = 256  # a reply's header lines are short; reading more is harmless (the rest is payload)


class ProtocolError(redis.ConnectionError):
    """The reply was not an array of bulk strings of the expected length."""


class _ErrorReply(Exception):
    """An error line, read whole (the connection is still in step): ``error`` is redis-py's own
    exception for it (LOADING -> BusyLoadingError, NOPERM -> NoPermissionError, ...)."""

    def __init__(self, error: redis.RedisError) -> None:
        super().__init__(str(error))
        self.error = error


def bulk_mget(client: redis.Redis, keys: Sequence[bytes]) -> list[memoryview | None]:
    """MGET keys; each value a read-only memoryview of a buffer of its own, None where missing."""
    pool = client.connection_pool
    if client.connection is not None or getattr(pool, "cache", None) is not None:
        return _plain(client, keys)  # one shared connection, or client-side caching: redis-py's own
    conn = pool.get_connection()
    try:
        values = _read(conn, keys)
    except _ErrorReply as reply:  # read whole: the connection is in step and goes back as it is
        pool.release(conn)
        if isinstance(reply.error, redis.ConnectionError):  # e.g. LOADING: redis-py retries those
            return _plain(client, keys)
        raise reply.error from None
    except (OSError, redis.ConnectionError, redis.TimeoutError) as exc:
        conn.disconnect()  # half-read: never back in the pool in this state
        pool.release(conn)
        if isinstance(exc, ProtocolError):
            raise
        return _plain(client, keys)  # a dropped connection: redis-py's retry policy decides
    except BaseException:
        conn.disconnect()
        pool.release(conn)
        raise
    pool.release(conn)
    return values


def _read(conn: AbstractConnection, keys: Sequence[bytes]) -> list[memoryview | None]:
    conn.send_command("MGET", *keys)
    sock = conn._sock  # redis-py keeps the socket here; send_command connected it
    if sock is None:
        raise redis.ConnectionError("the connection closed while sending MGET")
    reply = _Reply(sock)
    values = reply.values(len(keys))
    if reply.pending:  # bytes past the reply (a push message?): not ours to drop, nor to keep
        conn.disconnect()
    return values


def read_gets(conn: AbstractConnection, keys: Sequence[bytes]) -> list[memoryview | redis.RedisError | None]:
    """A pipelined GET of each key on ``conn`` (a Redis Cluster node's: an MGET there needs all
    its keys in one slot): each value as bulk_mget's, None where missing, or the error reply
    (MOVED, ASK, ...) for the caller to send again through the cluster client. Raises on a
    connection that failed mid-reply (the caller disconnects it)."""
    conn.send_packed_command(conn.pack_commands([("GET", key) for key in keys]))
    sock = conn._sock
    if sock is None:
        raise redis.ConnectionError("the connection closed while sending GETs")
    reply = _Reply(sock)
    values = [reply.one() for _ in keys]
    if reply.pending:
        conn.disconnect()
    return values


def _plain(client: redis.Redis, keys: Sequence[bytes]) -> list[memoryview | None]:
    values = cast("list[bytes | None]", client.mget(keys))
    return [None if v is None else memoryview(v) for v in values]


class _Reply:
    """One reply read from ``sock``: header lines through a small buffer, values straight in."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pending = bytearray()  # received, not consumed: the rest of a header read

    def values(self, count: int) -> list[memoryview | None]:
        head = self._line()
        if head[:1] == b"-":
            raise _ErrorReply(BaseParser.parse_error(head[1:].decode(errors="replace")))
        if head != b"*%d" % count:
            raise ProtocolError(f"MGET of {count} keys: reply header {head[:40]!r}")
        return [self._bulk() for _ in range(count)]

    def one(self) -> memoryview | redis.RedisError | None:
        """One reply of a bulk string, a null, or an error (returned, not raised: it was read
        whole, the connection is still in step)."""
        line = self._line()
        if line[:1] == b"-":
            return BaseParser.parse_error(line[1:].decode(errors="replace"))
        return self._bulk(line)

    def _bulk(self, line: bytes | None = None) -> memoryview | None:
        line = self._line() if line is None else line
        if line in (b"$-1", b"_"):  # a missing key: RESP2's null bulk string, RESP3's null
            return None
        if line[:1] != b"$" or not line[1:].isdigit():
            raise ProtocolError(f"MGET value header {line[:40]!r}")
        size = int(line[1:])
        buf = np.empty(size + 2, dtype=np.uint8)  # the value and its CRLF
        view = buf.data  # a memoryview of the array
        have = min(len(self.pending), len(view))
        view[:have] = self.pending[:have]
        del self.pending[:have]
        while have < len(view):
            got = self.sock.recv_into(view[have:])
            if got == 0:
                raise redis.ConnectionError("Redis closed the connection mid-reply")
            have += got
        if bytes(view[size:]) != b"\r\n":
            raise ProtocolError("MGET value not followed by CRLF")
        return view[:size].toreadonly()

    def _line(self) -> bytes:
        while (end := self.pending.find(b"\r\n")) < 0:
            chunk = self.sock.recv(_LINE_READ)
            if not chunk:
                raise redis.ConnectionError("Redis closed the connection mid-reply")
            self.pending += chunk
        line = bytes(self.pending[:end])
        del self.pending[: end + 2]
        return line
