"""`kvferry serve --autoscale` with real processes (the simulated engine, its own Redis): a burst
takes the stack from 1 worker to 2 on the api's kvferry_desired_workers, and once the burst has
drained and the policy's hold has passed, back to 1: the worker removed drains (exit 0) and every
job of the burst succeeds. Also the bounds' parsing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from broker.redis.connect import connect
from broker.worker_registry import live_workers
from ops.redis.server import free_port
from ops.scale.autoscaler import LocalAutoscaler, desired_from_metrics, parse_bounds
from ops.settings import Settings
from ops.stack.stack import Stack

FINAL = ("succeeded", "failed", "cancelled")


def test_bounds() -> None:
    assert parse_bounds("1:8") == (1, 8)
    for bad in ("0:2", "3:2", "2", "a:b", ""):
        with pytest.raises(ValueError):
            parse_bounds(bad)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    settings = Settings(
        model="simulated", engine="simulated", simulated_token_delay_s=0.05, cache_dir=tmp_path / "cache",
        api_port=free_port(), max_num_seqs=2, worker_concurrency=4, scale_in_hold_s=2.0,
        scale_min_workers=1, scale_max_workers=2, heartbeat_ttl_s=2,
    )  # fmt: skip
    with Stack(settings, 1, run_dir=tmp_path / "run", with_flower=False) as s:
        s.wait_ready(120)
        yield s


def test_a_burst_scales_out_then_in(stack: Stack) -> None:
    scaler = LocalAutoscaler(stack, (1, 2), lambda: desired_from_metrics(stack.api_url))
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            scaler.tick()
            stop.wait(0.5)

    ticker = threading.Thread(target=loop, daemon=True)
    ticker.start()
    client = connect(stack.settings.queue_url)
    body = {"model": "simulated", "prompt": "a burst", "max_tokens": 60}
    try:
        assert len(live_workers(client)) == 1
        with httpx.Client(base_url=stack.api_url, timeout=30) as http:
            ids = [
                http.post("/v1/jobs", json={"endpoint": "/v1/completions", "body": body}).json()["id"]
                for _ in range(8)
            ]  # 8 x 3 s of tokens, 2 seats a worker: the policy asks for the max, 2
            deadline = time.monotonic() + 90
            while len([w for w in live_workers(client) if w.engine is not None]) < 2:
                assert time.monotonic() < deadline, scaler.events
                time.sleep(0.2)
            assert scaler.events[0] == ("out", "worker2")
            for job_id in ids:  # every job of the burst ends well, across the scale-out
                while (status := http.get(f"/v1/jobs/{job_id}").json()["status"]) not in FINAL:
                    assert time.monotonic() < deadline + 60, job_id
                    time.sleep(0.2)
                assert status == "succeeded", job_id
        deadline = time.monotonic() + 60
        while ("in", "worker2") not in scaler.events or scaler.draining:
            assert time.monotonic() < deadline, scaler.events
            time.sleep(0.2)
        assert scaler.events == [("out", "worker2"), ("in", "worker2")]
        assert [w.name.split("@")[0] for w in live_workers(client)] == ["w1"]
    finally:
        stop.set()
        ticker.join(5)
        scaler.close()
