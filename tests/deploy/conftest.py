"""The api fixtures (a real redis-server, an api of its own) for the dashboard's check."""

from tests.api.conftest import deployment, fresh_api, rds, redis_url

__all__ = ["deployment", "fresh_api", "rds", "redis_url"]
