"""bulk_mget against a real redis-server (values, misses, an error reply, a killed connection), and
against a scripted socket for the replies a real server never sends (a wrong shape, a cut)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from kvstore.bulk_mget import ProtocolError, bulk_mget
from ops.redis_server import RedisServer


def test_values_match_redis_py_and_misses_are_none(redis_client: redis.Redis) -> None:
    values = {b"big": os.urandom(3 * 1024**2 + 7), b"small": b"x", b"empty": b"", b"crlf": b"\r\n$-1\r\n"}
    redis_client.mset(values)
    keys = [b"big", b"missing", b"small", b"empty", b"crlf", b"big"]
    got = bulk_mget(redis_client, keys)
    assert [None if v is None else bytes(v) for v in got] == redis_client.mget(keys)
    assert got[0] is not None and got[0].readonly
    assert bulk_mget(redis_client, [b"small"])[0] == b"x"  # the pooled connection is still in step


def test_a_non_string_key_reads_as_a_miss(redis_client: redis.Redis) -> None:
    redis_client.rpush(b"list", b"a")
    redis_client.set(b"s", b"v")
    assert [None if v is None else bytes(v) for v in bulk_mget(redis_client, [b"list", b"s"])] == [None, b"v"]


def test_an_error_reply_raises_and_the_connection_stays_usable(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    redis_client.set(b"k", b"v")
    allowed = ["+get", "+ping"]
    redis_client.acl_setuser("reader", enabled=True, passwords=["+pw"], keys=["*"], commands=allowed)
    limited = redis.Redis.from_url(redis_server.url, username="reader", password="pw")
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):  # redis-py's own class for NOPERM
            bulk_mget(limited, [b"k"])
        assert limited.get(b"k") == b"v"  # same pooled connection, nothing left unread on it
        assert len(limited.connection_pool._available_connections) == 1
    finally:
        limited.close()
        redis_client.acl_deluser("reader")


def test_a_killed_connection_is_dropped_and_the_read_retried(redis_client: redis.Redis) -> None:
    redis_client.set(b"k", b"v" * 1000)
    assert bulk_mget(redis_client, [b"k"])[0] == b"v" * 1000
    redis_client.client_kill_filter(_type="normal", skipme=True)  # every other connection: the pool's
    redis_client.connection_pool.disconnect(inuse_connections=False)
    got = bulk_mget(redis_client, [b"k"])
    assert got[0] == b"v" * 1000


class _Scripted:
    """A one-connection server: +OK to the client's CLIENT SETINFO, ``reply`` to the next command
    (the MGET: the client speaks RESP2, so it sends no HELLO first), then it closes and listens no
    more, so a retry finds no server."""

    def __init__(self, reply: bytes) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.reply = reply
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        self.listener.close()
        with conn:
            while b"SETINFO" in conn.recv(65536):
                conn.sendall(b"+OK\r\n")
            conn.sendall(self.reply)


def _client(port: int) -> redis.Redis:
    return redis.Redis(port=port, protocol=2, socket_timeout=5, retry=Retry(NoBackoff(), 1))


@pytest.fixture
def scripted() -> Iterator[type[_Scripted]]:
    yield _Scripted


@pytest.mark.parametrize(
    "reply",
    [b"*3\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n", b"*2\r\n:1\r\n:2\r\n", b"*2\r\n$1\r\nab\r\n$1\r\nc\r\n"],
    ids=["wrong-count", "not-bulk", "no-crlf"],
)
def test_a_reply_of_another_shape_raises_and_drops_the_connection(
    scripted: type[_Scripted], reply: bytes
) -> None:
    server = scripted(reply)
    client = _client(server.port)
    with pytest.raises(ProtocolError):
        bulk_mget(client, [b"a", b"b"])
    assert all(c._sock is None for c in client.connection_pool._available_connections)


def test_a_reply_cut_mid_value_falls_back_and_raises_a_connection_error(scripted: type[_Scripted]) -> None:
    server = scripted(b"*1\r\n$100\r\n" + b"x" * 40)  # then the server closes
    client = _client(server.port)
    with pytest.raises(redis.ConnectionError):  # the retry through redis-py finds no server
        bulk_mget(client, [b"a"])
    assert all(c._sock is None for c in client.connection_pool._available_connections)
