"""A real worker whose KV pool, not its seats, is the bound (issue 43): its heartbeat, read from
Redis as the api reads it, says it runs fewer sequences than its 8 seats while the rest wait in its
engine for pool room, and the scaling signal and policy on it ask for a second worker where the
seats alone ask for one."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import redis

from api.routing.fleet import WorkerView
from api.scale.policy import FleetLoad, ScalePolicy, raw_desired
from api.scale.signal import fleet_load
from broker.worker_registry import live_workers
from tests.integration.conftest import WorkerProcess, tiny_block_bytes
from tests.integration.jobs import random_prompt, send, token_job

POLICY = ScalePolicy(min_workers=1, max_workers=8, target_seat_use=0.8)  # no spare seats, no lead
JOBS = 6


def test_a_pool_bound_worker_asks_for_another(
    worker_factory: Callable[..., WorkerProcess], celery_app: Any, redis_client: redis.Redis
) -> None:
    # 12 blocks of 16 tokens; 6 jobs of 40-token prompts (3 blocks) and 60 tokens more (7 blocks in
    # all): the pool holds at most 4 of them at once, the seats 8. Prefill steps are slowed, so the
    # recomputes after preemptions keep the pressure on for a few heartbeats (1 s: at 0.5 s, a
    # loaded machine's heartbeats, 0.75 s apart, once caught no step with some running and some
    # waiting). 6: under 0.8 of the 8 seats however many are in flight when a heartbeat is read
    # (with 8, a loaded machine caught all 8 at once, and the seats alone asked for two).
    worker = worker_factory(
        "poolroom", "--cache-size", str(12 * tiny_block_bytes()), "--max-num-seqs", "8",
        "--debug-slow-step-s", "1.0",
    )  # fmt: skip
    handles = [send(celery_app, token_job(random_prompt(430 + i), 60), worker.queue) for i in range(JOBS)]
    seen: list[FleetLoad] = []
    deadline = time.monotonic() + 60
    while not all(h.ready() for h in handles) and time.monotonic() < deadline:
        for status in live_workers(redis_client):
            e = status.engine
            if status.name == worker.name and e is not None and e.num_waiting > 0:
                held = status.jobs_running - e.num_running  # as signal.read_waiting counts them
                seen.append(fleet_load([WorkerView(status.name, True, status)], {"interactive": held}, None))
        time.sleep(0.05)
    for h in handles:
        h.get(timeout=60)

    assert seen, "no heartbeat caught a sequence waiting in the engine"
    pressed = [x for x in seen if x.seats_usable is not None and x.seats_usable < 5]
    assert pressed, seen  # room under 5 where the seats say 8
    load = max(pressed, key=lambda x: x.jobs_running + x.jobs_waiting)
    assert load.seats_total == 8 and load.jobs_running < 8, load
    assert raw_desired(POLICY, dataclasses.replace(load, seats_usable=None, engine_wait_s=0.0)) == 1
    assert raw_desired(POLICY, dataclasses.replace(load, engine_wait_s=0.0)) >= 2, load
