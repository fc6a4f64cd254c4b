"""A real redis-server of these tests' own (no worker consumes it: the sweeps here are the only
ones), flushed per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from ops.redis_server import RedisServer


@pytest.fixture(scope="session")
def sweep_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
def rds(sweep_redis: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(sweep_redis.url)
    client.flushall()
    yield client
    client.close()
