"""The Redis KV tier's report for /metrics, as a worker last published it (keys.TIER_REPORT, see
workers/tiers/report_publisher.py): its counters, what it stores and its pins per tenant. The api
reads that one key of the queue Redis, never the KV tier."""

from __future__ import annotations

import json
import logging
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from broker import keys

log = logging.getLogger(__name__)


class TierReader:
    def __init__(self, client: aioredis.Redis) -> None:
        self.redis = client

    async def report(self) -> dict[str, Any] | None:
        """None when no worker published one lately, or Redis cannot be read: /metrics still
        answers with the rest."""
        try:
            raw: Any = await self.redis.get(keys.TIER_REPORT)
        except (RedisError, OSError) as exc:
            log.warning("no Redis tier figures: %s", exc)
            return None
        if raw is None:
            return None
        try:
            report = json.loads(raw)
        except ValueError:
            log.warning("the published tier report is not JSON; ignored")
            return None
        return report if isinstance(report, dict) else None
