"""Two real worker processes (simulated engine: no model): one sweeps; SIGKILLed, the other takes
the sweeper lease over within seconds, as its heartbeat says."""

from __future__ import annotations

import json
import time
from pathlib import Path

import redis

from broker import keys
from broker.worker_registry import MAINTENANCE_FIELD
from ops.bench.fleet.run import _wait_live
from ops.bench.fleet.workers import Fleet
from ops.redis.server import RedisServer
from tests.integration.conftest import wait_for
from workers.jobs.sweeper_lease import holder


def _sweeping(client: redis.Redis, name: str) -> bool:
    raw = client.hget(keys.worker_heartbeat(name), MAINTENANCE_FIELD)
    return raw is not None and bool(json.loads(raw)["sweeper"])


def test_the_sweeper_killed_another_takes_over(tmp_path: Path) -> None:
    with (
        RedisServer(tmp_path / "redis") as server,
        Fleet(server.url, 2, tmp_path / "fleet", 2, 0.01, 4) as fleet,
    ):
        client = redis.Redis.from_url(server.url)
        _wait_live(fleet, client, timeout_s=60)
        names = [f"fleet{i}@" for i in range(2)]
        wait_for(lambda: holder(client) is not None, 10, "a sweeper")
        first = holder(client)
        assert first is not None
        index = next(i for i, n in enumerate(names) if first.startswith(n))
        other = first.replace(names[index], names[1 - index])
        wait_for(lambda: _sweeping(client, first), 5, "the sweeper's heartbeat to say so")
        assert not _sweeping(client, other)  # one sweeper at a time
        killed_at = time.monotonic()
        fleet.processes[index].kill()
        wait_for(lambda: holder(client) == other and _sweeping(client, other), 15, "the other to take over")
        assert time.monotonic() - killed_at < 8  # the lease's TTL (3 s) and a stand-by's two passes
