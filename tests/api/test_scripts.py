"""The api's Lua scripts (tenant job admission and end, the fleet's heartbeats) go through redis-py's
register_script: EVALSHA on each call, the text sent only when Redis lacks it."""

from __future__ import annotations

import redis

from tests.api.conftest import MODEL, Served
from tests.api.fake_worker import FakeWorker
from tests.api.test_ops import heartbeat


def _calls(rds: redis.Redis) -> dict[str, int]:
    stats = rds.info("commandstats")
    return {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("eval", "evalsha")}


def test_the_api_runs_its_scripts_by_sha(api: Served, rds: redis.Redis, worker: FakeWorker) -> None:
    heartbeat(rds, "w1@h", None)
    rds.config_resetstat()
    with api.client() as c:
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert c.post("/v1/chat/completions", json=chat).status_code == 200  # admitted, finished
        assert c.get("/healthz").json()["workers"] == 1  # the fleet's heartbeats
    calls = _calls(rds)
    assert calls["eval"] == 0 and calls["evalsha"] > 0, calls
