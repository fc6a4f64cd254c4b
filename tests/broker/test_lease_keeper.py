"""LeaseKeeper.try_take: copies of one job in one process never both take it, even though the
start script takes a lease of this very owner as its own (a retry after a lost reply)."""

from __future__ import annotations

import threading
import time
from typing import Any

import redis

from broker.jobs.lease import LeaseHolder
from ops.redis.server import RedisServer
from workers.jobs.lease_keeper import LeaseKeeper


def test_concurrent_copies_in_one_process_take_the_job_once(
    redis_server: RedisServer, rds: redis.Redis
) -> None:
    keeper = LeaseKeeper(rds, "w1@h", ttl_s=30, renew_s=10)
    start = keeper.leases.start

    def slow_start(*args: Any) -> Any:  # a wide window between the check and the script
        time.sleep(0.05)
        return start(*args)

    keeper.leases.start = slow_start  # type: ignore[method-assign]
    barrier = threading.Barrier(6)
    got: list[object] = []

    def copy() -> None:
        barrier.wait()
        got.append(keeper.try_take("j1"))

    threads = [threading.Thread(target=copy) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    try:
        taken = [g for g in got if isinstance(g, tuple)]
        assert len(got) == 6 and len(taken) == 1
        assert all(isinstance(g, LeaseHolder) and g.owner == keeper.owner for g in got if g not in taken)
        keeper.release(taken[0][0])  # type: ignore[index]
        again = keeper.try_take("j1")  # released: the next copy takes it, at a new epoch
        assert isinstance(again, tuple) and again[0].epoch == 2
    finally:
        keeper.stop()
