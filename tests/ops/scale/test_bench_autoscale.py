"""`kvferry bench autoscale`: the fleet model on a seeded trace, driven by the real policy: the
keys the issue names, a deterministic result, a fleet that grows in bursts and pays fewer
worker-seconds than a static MAX, and the model's own accounting on a trace worked by hand."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from api.scale.policy import ScalePolicy
from ops.bench.autoscale.fleet_model import run_fleet
from ops.bench.autoscale.trace import Job, TraceSpec, make_trace
from ops.cli.main import main

KEYS = {"queue_wait_p95_s", "worker_seconds", "worker_seconds_ratio", "queue_wait_p95_ratio"}


def test_command_writes_the_figures(tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    args = ["bench", "autoscale", "--duration-s", "300", "--json", str(out)]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    doc = json.loads(out.read_text())
    assert not KEYS - doc.keys()
    assert 1 < doc["autoscale"]["max_workers"] <= 8
    assert doc["worker_seconds_ratio"] < 1.0
    assert doc["static_8"]["worker_seconds"] >= 8 * 300
    assert CliRunner().invoke(main, args).exit_code == 0
    assert json.loads(out.read_text()) == doc  # seeded


def test_trace_is_seeded_and_bursty() -> None:
    a, b = make_trace(TraceSpec(seed=1, duration_s=600)), make_trace(TraceSpec(seed=1, duration_s=600))
    assert a == b and a != make_trace(TraceSpec(seed=2, duration_s=600))
    per_10s = [sum(1 for j in a if k * 10 <= j.arrival_s < (k + 1) * 10) for k in range(60)]
    assert max(per_10s) > 5 * (sorted(per_10s)[30] + 1)  # bursts well above the median


def test_model_accounting_by_hand() -> None:
    jobs = [Job(0.0, 2.0), Job(0.0, 2.0), Job(0.0, 2.0)]  # 3 jobs, 1 worker of 2 seats
    run = run_fleet(jobs, seats=2, initial=1, policy=None, dt=0.5)
    assert sorted(run.waits) == [0.0, 0.0, 2.0]  # the third waits for a seat
    assert run.worker_seconds == 4.5  # alive until its last job ends (the loop's last tick)
    scaled = run_fleet(jobs, seats=2, initial=1, policy=ScalePolicy(1, 2, scale_in_hold_s=0), start_s=0.5)
    assert scaled.max_workers == 2 and max(scaled.waits) < 2.0


def test_chaos_plans_scale_ins_among_the_kills() -> None:
    from ops.chaos.faults import FaultInjector

    assert FaultInjector._plan(0, 0, scale_in=2) == ["scale_in", "scale_in"]
    assert FaultInjector._plan(2, 0, scale_in=1) == ["kill", "scale_in", "kill"]


def test_model_pool_room_by_hand() -> None:
    # 1 worker of 4 seats, a 10-block pool, jobs of 6 blocks: it takes both, runs one at a time.
    jobs = [Job(0.0, 2.0, 6), Job(0.0, 2.0, 6), Job(0.0, 2.0, 3)]
    run = run_fleet(jobs, seats=4, initial=1, policy=None, dt=0.5, pool_blocks=10)
    assert sorted(run.waits) == [0.0, 2.0, 2.0]  # the third, behind the second, first come first served


def test_a_pool_bound_load_scales_out_where_the_seats_say_enough() -> None:
    """A steady load whose pools fit ~4 of 8 seats: the policy that reads the pools asks for more
    workers and the waits (in queue and engine) fall; blind to them it sizes by seats."""
    jobs = make_trace(TraceSpec(duration_s=300, base_rate=1.2, burst_rate=1.2, prompt_tokens_median=1000))
    policy = ScalePolicy(1, 8, scale_in_hold_s=10)  # no spare seats, no growth lead: sizing alone
    aware = run_fleet(jobs, 8, 1, policy, pool_blocks=350)
    blind = run_fleet(jobs, 8, 1, policy, pool_blocks=350, pool_blind=True)
    assert aware.queue_wait_p95_s < blind.queue_wait_p95_s / 2, (aware, blind)
    assert aware.worker_seconds > blind.worker_seconds
