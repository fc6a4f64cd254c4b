"""deploy/grafana/kvferry.json queries only metrics the api's /metrics exposes (a real api and
redis-server; a tier report published so the Redis tier's families are there too)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import redis

from broker import keys
from tests.api.conftest import Served

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "kvferry.json"
SUFFIXES = ("_bucket", "_sum", "_count", "_total")


def queried() -> set[str]:
    names = set()
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel["targets"]:
            names |= set(re.findall(r"\bkvferry_[a-z0-9_]+", target["expr"]))
    return names


def family(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def test_every_queried_metric_is_exposed(fresh_api: Served, rds: redis.Redis) -> None:
    rds.set(
        keys.TIER_REPORT,
        json.dumps({"hits": 1, "misses": 1, "bytes_stored": 1, "pinned_bytes_by_tenant": {}}),
    )
    with fresh_api.client() as c:
        text = c.get("/metrics").text
    exposed = set(re.findall(r"^# HELP (kvferry_[a-z0-9_]+)", text, re.M))
    missing = {n for n in queried() if family(n) not in {family(e) for e in exposed}}
    assert not missing, missing
    assert {"kvferry_desired_workers", "kvferry_jobs_waiting", "kvferry_cached_tokens_total"} <= queried()
