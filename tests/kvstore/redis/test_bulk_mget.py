"""bulk_mget against a real redis-server (values, misses, an error reply, a killed connection), and
against a scripted socket for the replies a real server never sends (a wrong shape, a cut)."""

from __future__ import annotations

import os
import socket
import threading

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from kvstore.redis.bulk_mget import ProtocolError, bulk_mget
from ops.redis.server import RedisServer


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


CUT = object()  # in a script: close the connection there


class _Scripted:
    """A server that answers each command (but the client's CLIENT SETINFO, answered +OK) with the
    next reply of its script, over as many connections as the client opens; a reply followed by
    CUT is sent and its connection closed. Script done: it stops listening, so a retry finds no
    server. Its clients speak RESP2, so they send no HELLO first."""

    def __init__(self, *script: bytes | object) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.script = list(script)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with self.listener:
            while self.script:
                conn, _ = self.listener.accept()
                with conn:
                    self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        while self.script:
            command = conn.recv(65536)
            if not command:
                return
            if b"SETINFO" in command:
                conn.sendall(b"+OK\r\n")
                continue
            reply = self.script.pop(0)
            assert isinstance(reply, bytes)
            conn.sendall(reply)
            if self.script and self.script[0] is CUT:
                self.script.pop(0)
                return


def _client(port: int) -> redis.Redis:
    return redis.Redis(port=port, protocol=2, socket_timeout=5, retry=Retry(NoBackoff(), 1))


def _pooled_socks(client: redis.Redis) -> list[object]:
    return [c._sock for c in client.connection_pool._available_connections]


@pytest.mark.parametrize(
    "reply",
    [b"*3\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n", b"*2\r\n:1\r\n:2\r\n", b"*2\r\n$1\r\nab\r\n$1\r\nc\r\n"],
    ids=["wrong-count", "not-bulk", "no-crlf"],
)
def test_a_reply_of_another_shape_raises_and_drops_the_connection(reply: bytes) -> None:
    client = _client(_Scripted(reply).port)
    with pytest.raises(ProtocolError):
        bulk_mget(client, [b"a", b"b"])
    assert _pooled_socks(client) == [None]


def test_a_reply_cut_mid_value_is_read_again_on_a_new_connection() -> None:
    whole = b"*1\r\n$100\r\n" + b"x" * 100 + b"\r\n"
    client = _client(_Scripted(whole[:60], CUT, whole).port)
    assert bulk_mget(client, [b"a"]) == [b"x" * 100]
    socks = _pooled_socks(client)  # the cut connection was dropped, then the retry connected it anew
    assert len(socks) == 1 and socks[0] is not None


def test_a_reply_cut_with_no_server_left_raises_a_connection_error() -> None:
    client = _client(_Scripted(b"*1\r\n$100\r\n" + b"x" * 40, CUT).port)
    with pytest.raises(redis.ConnectionError):  # the retry through redis-py finds no server
        bulk_mget(client, [b"a"])
    assert _pooled_socks(client) == [None]


def test_loading_is_retried_through_redis_py_on_the_same_connection() -> None:
    server = _Scripted(b"-LOADING Redis is loading the dataset in memory\r\n", b"*1\r\n$1\r\nv\r\n")
    client = _client(server.port)
    assert bulk_mget(client, [b"k"]) == [b"v"]
    assert len(client.connection_pool._available_connections) == 1  # in step: kept and reused


def test_bytes_past_the_reply_drop_the_connection_but_not_the_values() -> None:
    client = _client(_Scripted(b"*1\r\n$1\r\nv\r\n>2\r\n$7\r\nmessage\r\n").port)
    assert bulk_mget(client, [b"k"]) == [b"v"]
    assert _pooled_socks(client) == [None]
