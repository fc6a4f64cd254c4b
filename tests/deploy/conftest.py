"""The api fixtures (a real redis-server, an api of its own) for the dashboard's check."""

from tests.api.conftest import fresh_api, rds, redis_url

__all__ = ["fresh_api", "rds", "redis_url"]
