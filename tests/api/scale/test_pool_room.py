"""The policy where the KV pool, not the seat count, bounds what a worker runs (issue 43): a
pool-bound overload raises the figure, a seat-bound load reads as before, the size taken on a
pool-bound load holds once spread, and a wait inside an engine counts as lateness. Pure: heartbeats
built by hand into the signal's fleet_load, then the policy."""

from __future__ import annotations

import dataclasses

import pytest

from api.routing.fleet import WorkerView
from api.scale.policy import FleetLoad, Hysteresis, ScalePolicy, pool_room, raw_desired
from api.scale.signal import fleet_load
from broker.messages import EngineFigures, WorkerStatus

POLICY = ScalePolicy(min_workers=1, max_workers=8, target_seat_use=0.8)  # spare 0, lead 0
BLOCKS = 100  # each worker's pool


def worker(running: int, held: int, used: int, kept: int = 0, waited_s: float = 0.0) -> WorkerView:
    """A live worker with 8 seats: `running` sequences in its engine holding `used` blocks of 100
    (`kept` of them session tails), and `held` more jobs it holds that wait in its engine."""
    engine = EngineFigures(
        running, held, 0, 8, 0, BLOCKS, used, 0, 1, 0, 0, 0.0, 0, 0,
        pool_blocks_kept=kept, oldest_waiting_s=waited_s,
    )  # fmt: skip
    status = WorkerStatus("w", "q", "m", running + held, 0, 0, 0.0, engine, concurrency=12, seats=8)
    return WorkerView("w", True, status)


def load_of(*views: WorkerView, queued: int = 0, p95: float | None = None) -> FleetLoad:
    held = sum(v.status.jobs_running - v.status.engine.num_running for v in views)  # type: ignore[union-attr]
    return fleet_load(list(views), {"interactive": queued + held, "batch": 0}, p95)


def by_seats(load: FleetLoad) -> int:
    """The figure the seats alone give (the policy before issue 43)."""
    return raw_desired(POLICY, dataclasses.replace(load, seats_usable=None, engine_wait_s=0.0))


def test_pool_room_is_the_running_sequences_mean_blocks_into_the_pool() -> None:
    assert pool_room(8, 0, BLOCKS, 0) == 8  # idle: its seats
    assert pool_room(8, 5, BLOCKS, 100) == 5  # full at the 5 it runs
    assert pool_room(8, 5, BLOCKS, 80) == 6.25
    assert pool_room(8, 3, BLOCKS, 12) == 8  # short sequences: the seats bound
    assert pool_room(0, 3, BLOCKS, 12) == 0  # seats unknown: unknown, as seats_total


def test_a_pool_bound_overload_scales_out() -> None:
    # Two workers whose pools are full at 5 sequences each, 1 more waiting in each engine.
    load = load_of(worker(5, 1, 100), worker(5, 1, 98))
    assert (load.jobs_running, load.jobs_waiting, load.seats_total) == (10, 2, 16)
    assert by_seats(load) == 2  # 12 / 6.4: the seats say two workers are plenty
    assert raw_desired(POLICY, load) == 3  # 12 / (5.05 x 0.8) = 2.97
    # The review's example: 3 waiting in each engine.
    assert raw_desired(POLICY, load_of(worker(5, 3, 100), worker(5, 3, 100))) == 4  # 16 / 4; seats: 3


def test_kept_session_tails_are_not_the_running_sequences_room() -> None:
    # 4 sequences hold 40 blocks, 45 more are kept tails (given back first): room 10 -> 8 seats.
    load = load_of(worker(4, 0, 85, kept=45), queued=3)
    assert load.seats_usable == 8
    assert raw_desired(POLICY, load) == by_seats(load) == 2  # 7 / 6.4


@pytest.mark.parametrize(
    ("views", "queued"),
    [
        ((worker(8, 0, 40), worker(8, 0, 48)), 4),  # seats full, pools half used: 20 / 6.4
        ((worker(3, 0, 20), worker(2, 0, 10)), 0),  # light: 5 / 6.4
        ((worker(8, 2, 90), worker(6, 0, 60)), 7),  # room 8.9 and 10: the seats still bound
    ],
)
def test_a_seat_bound_load_reads_as_before(views: tuple[WorkerView, ...], queued: int) -> None:
    load = load_of(*views, queued=queued)
    assert load.seats_usable == load.seats_total == 16
    assert raw_desired(POLICY, load) == by_seats(load)


def test_the_size_taken_on_a_pool_bound_load_holds_once_spread() -> None:
    h = Hysteresis(POLICY)
    assert h.update(load_of(worker(5, 3, 100), worker(5, 3, 100)), now=0) == 4
    # Spread over 4 workers: nothing waits, 4 sequences in each pool, 80 % of it.
    spread = load_of(*(worker(4, 0, 80) for _ in range(4)))
    assert by_seats(spread) == 3  # 16 / 6.4: by seats, one would go, and the pools refill
    assert h.update(spread, now=5) == 4
    assert h.update(spread, now=60) == 4  # past the hold: room 5 a worker, 16 / 4
    # The load falls: scale-in after the hold, as before.
    light = load_of(*(worker(1, 0, 20) for _ in range(4)))
    assert h.update(light, now=61) == 4
    assert h.update(light, now=92) == 1


def test_a_wait_inside_an_engine_is_late() -> None:
    # Seats and pools have room by the figures (a long prompt waits), no job started lately.
    load = load_of(worker(4, 1, 60, waited_s=3.0), worker(4, 0, 50))
    assert (load.wait_p95_s, load.engine_wait_s) == (None, 3.0)
    assert by_seats(load) == 2  # 9 / 6.4, and no queue wait p95
    assert raw_desired(POLICY, load) == 3  # late: workers + 1
    assert raw_desired(POLICY, load_of(worker(4, 1, 60, waited_s=1.5), worker(4, 0, 50))) == 2
    # ... and holds scale-in off while it lasts (over half the target, something waits).
    h = Hysteresis(POLICY)
    h.update(load_of(*(worker(8, 0, 40) for _ in range(4)), queued=2), now=0)  # 34 / 6.4 -> 6
    assert h.update(load_of(worker(1, 1, 10, waited_s=1.2), worker(1, 0, 10)), now=1) == 6
    assert h.update(load_of(worker(1, 1, 10, waited_s=1.2), worker(1, 0, 10)), now=40) == 6
    assert h.update(load_of(worker(1, 1, 10, waited_s=0.2), worker(1, 0, 10)), now=41) == 1
