"""A real redis-server of these tests' own (no worker consumes it: the sweeps here are the only
ones), flushed per test: tests/broker's fixtures, the server also under the name these tests use."""

from __future__ import annotations

import pytest

from ops.redis.server import RedisServer
from tests.broker.conftest import rds, redis_server

__all__ = ["rds", "redis_server", "sweep_redis"]


@pytest.fixture
def sweep_redis(redis_server: RedisServer) -> RedisServer:
    return redis_server
