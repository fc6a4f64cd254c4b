"""A worker's Flower fields: flat (no dict for Flower to print raw), each with its unit."""

from __future__ import annotations

import time

from broker.messages import EngineFigures, WorkerStatus
from workers.process.flower_fields import flat_fields


def test_flat_fields_with_units() -> None:
    engine = EngineFigures(3, 1, 10, 8, 120, 256, 64, 32, 4096, 200, 50, 0.125, 2 * 1024**2, 256 * 4096)
    status = WorkerStatus("w1@h", "kvferry.worker.w1@h", "tiny", 4, 9, 1, time.time(), engine, True, 36, 32)
    fields = flat_fields(status)
    assert not any(isinstance(v, dict | list) for v in fields.values())
    assert fields["kvferry.kv_pool_used"] == "64 / 256 blocks (25.0 %)"
    assert fields["kvferry.kv_pool_size"] == "1.0 MiB (4096 bytes a block)"
    assert fields["kvferry.prefix_hit_rate"] == "25.0 % of 200 prompt tokens"
    assert fields["kvferry.seqs_running"] == "3 / 8 seqs" and fields["kvferry.weights"] == "2.0 MiB"
    assert fields["kvferry.concurrency"] == "36 jobs, 32 engine seats"


def test_a_loading_worker_shows_its_state() -> None:
    status = WorkerStatus("w1@h", "q", "tiny", 0, 0, 0, time.time())
    fields = flat_fields(status)
    assert fields["kvferry.state"] == "loading" and "kvferry.kv_pool_used" not in fields
