"""`kvferry bench fleet`, small: two simulated-engine workers (real processes, no torch), a few
jobs through the api's path, every figure reported; one sweeper."""

from __future__ import annotations

import time
from pathlib import Path

import redis

from ops.bench.fleet.run import _wait_live, run_fleet_bench
from ops.bench.fleet.workers import Fleet
from ops.redis.server import RedisServer


def test_fleet_smoke() -> None:
    results = run_fleet_bench(
        [2], jobs_per_worker=3, idle_s=0.5, route_workers=4, route_digests=200, max_tokens=4, timeout_s=60
    )
    (row,) = results["fleets"]
    assert row["jobs"] == row["jobs_completed"] == 6  # done, every token there
    assert row["sweepers"] == 1 and row["maintenance_failures"] == 0
    assert row["redis_cmds_per_job"] > 10 and row["redis_cpu_ms_per_1000_jobs"] > 0
    assert row["maintenance_ms_per_worker_s"] > 0
    assert results["redis_cmds_per_job_ratio_2_vs_2"] == 1.0
    assert 0 < results["route_p99_ms"] < 1000


def test_a_simulated_worker_loads_no_torch(tmp_path: Path) -> None:
    with (
        RedisServer(tmp_path / "redis") as server,
        Fleet(server.url, 1, tmp_path / "fleet", 2, 0.01, 4) as fleet,
    ):
        _wait_live(fleet, redis.Redis.from_url(server.url), timeout_s=60)
        time.sleep(0.5)
        maps = Path(f"/proc/{fleet.processes[0].pid}/maps").read_text()
        assert "libtorch" not in maps and "transformers" not in maps
