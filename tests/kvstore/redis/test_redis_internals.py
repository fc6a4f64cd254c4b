"""kvstore/redis/bulk_mget.py reads MGET replies by hand over redis-py's own connections, through parts
of redis-py that it does not promise to keep. Each one is checked here by name, so that a redis-py
that moved one fails here, saying which, instead of somewhere inside a tier read; pyproject.toml
pins redis-py to the versions these pass on."""

from __future__ import annotations

import inspect
import socket
from typing import NoReturn

import pytest
import redis
from redis.connection import AbstractConnection

from ops.redis.server import RedisServer


def _moved(what: str) -> NoReturn:
    pytest.fail(
        f"redis-py {redis.__version__}: {what}; kvstore/redis/bulk_mget.py relies on it", pytrace=False
    )


def test_the_error_parser_it_borrows() -> None:
    try:
        from redis._parsers import BaseParser
    except ImportError:
        _moved("redis._parsers.BaseParser is gone")
    if not callable(getattr(BaseParser, "parse_error", None)):
        _moved("redis._parsers.BaseParser.parse_error is gone")
    if not isinstance(BaseParser.parse_error("NOPERM no permissions"), redis.exceptions.NoPermissionError):
        _moved("BaseParser.parse_error('NOPERM ...') no longer gives NoPermissionError")
    if not isinstance(BaseParser.parse_error("LOADING Redis is loading"), redis.ConnectionError):
        _moved(
            "BaseParser.parse_error('LOADING ...') no longer gives a ConnectionError (retried by redis-py)"
        )


def test_the_pool_and_connection_parts_it_uses(redis_server: RedisServer) -> None:
    client = redis.Redis.from_url(redis_server.url)
    single = redis.Redis.from_url(redis_server.url, single_connection_client=True)
    try:
        if not hasattr(client, "connection") or client.connection is not None or single.connection is None:
            _moved("Redis.connection (the single-connection client's own) is gone")
        pool = client.connection_pool
        if not hasattr(pool, "cache"):
            _moved("ConnectionPool.cache (set for client-side caching) is gone")
        needed = [
            p
            for p in inspect.signature(pool.get_connection).parameters.values()
            if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        if needed:
            _moved(f"ConnectionPool.get_connection() needs arguments: {[p.name for p in needed]}")
        conn = pool.get_connection()
        try:
            if not isinstance(conn, AbstractConnection):
                _moved(f"a pooled connection is no redis.connection.AbstractConnection: {type(conn)}")
            conn.send_command("PING")
            if not isinstance(getattr(conn, "_sock", None), socket.socket):
                _moved("Connection._sock (the socket send_command connected) is gone")
            if conn.read_response() not in (True, b"PONG", "PONG"):
                _moved("the reply did not come back on Connection._sock's connection")
            conn.disconnect()
            if getattr(conn, "_sock", None) is not None:
                _moved("Connection.disconnect() no longer clears Connection._sock")
        finally:
            pool.release(conn)
    finally:
        client.close()
        single.close()
