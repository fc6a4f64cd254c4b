"""The Redis KV tier's report, published for the api: one worker at a time (whoever takes the
lock first in each period) reads the tier (kvstore/redis/report.py) and stores the report as
JSON under keys.TIER_REPORT, where /metrics reads it. The api never reads the KV tier itself."""

from __future__ import annotations

import json
from typing import Any

import redis

from broker import keys
from kvstore.redis.client import KVClient
from kvstore.redis.report import read_report

REPORT_EVERY_S = 5.0  # how often one worker of the fleet reads the tier for /metrics
REPORT_TTL_S = 3 * REPORT_EVERY_S  # a fleet that stopped publishing shows no figures, not old ones


def publish_report(queue: redis.Redis, kv: KVClient, worker: str, every_s: float = REPORT_EVERY_S) -> bool:
    """Read and publish the tier's report if no worker did within `every_s`; True if this one did."""
    if not queue.set(keys.TIER_REPORT_LOCK, worker, nx=True, px=max(1, int(every_s * 1000))):
        return False
    report: dict[str, Any] = read_report(kv, queue)
    queue.set(keys.TIER_REPORT, json.dumps(report), px=int(max(every_s * 3, REPORT_TTL_S) * 1000))
    return True
