"""The scaling policy, pure: the raw figure from seats and queue wait, and its hysteresis (up at
once, down only after a calm hold, to the hold's peak)."""

from __future__ import annotations

import pytest

from api.scale.policy import FleetLoad, Hysteresis, ScalePolicy, raw_desired

POLICY = ScalePolicy(min_workers=1, max_workers=8, wait_target_s=2.0, target_seat_use=0.8, scale_in_hold_s=30)


def load(workers: int, running: int, waiting: int, p95: float | None = None, seats: int = 4) -> FleetLoad:
    return FleetLoad(workers, workers * seats, running, waiting, p95)


def test_idle_fleet_wants_the_minimum() -> None:
    assert raw_desired(POLICY, load(3, 0, 0)) == 1
    assert raw_desired(ScalePolicy(min_workers=0), load(0, 0, 0)) == 0


def test_seats_demand_at_the_target_use() -> None:
    assert raw_desired(POLICY, load(1, 3, 0)) == 1  # 3 / (4 x 0.8) = 0.94
    assert raw_desired(POLICY, load(1, 4, 0)) == 2  # a full worker is over 80 %
    assert raw_desired(POLICY, load(1, 4, 9)) == 5  # 13 / 3.2 = 4.06
    assert raw_desired(POLICY, load(2, 8, 100)) == 8  # capped at max_workers


def test_no_live_worker_uses_the_default_seats() -> None:
    assert raw_desired(ScalePolicy(default_seats=8), FleetLoad(0, 0, 0, 13, None)) == 3  # 13 / 6.4


def test_late_queue_adds_a_worker_only_while_jobs_wait() -> None:
    assert raw_desired(POLICY, load(2, 5, 1, p95=2.5)) == 3  # seats alone: 6 / 6.4 -> 1
    assert raw_desired(POLICY, load(2, 5, 0, p95=9.0)) == 2  # nothing waits: a stale p95
    assert raw_desired(POLICY, load(2, 5, 1, p95=1.9)) == 2


def test_hysteresis_up_at_once_down_after_a_calm_hold() -> None:
    h = Hysteresis(POLICY)
    assert h.update(load(1, 0, 0), now=0) == 1
    assert h.update(load(1, 4, 9), now=1) == 5  # a burst: at once
    assert h.update(load(5, 2, 0), now=2) == 5  # low from here
    assert h.update(load(5, 6, 0), now=20) == 5  # raw 2 (the hold's peak so far)
    assert h.update(load(5, 0, 0), now=33) == 2  # after 30 s: the peak of the hold, not 1
    assert h.update(load(2, 0, 0), now=40) == 2  # a new hold starts
    assert h.update(load(2, 0, 0), now=71) == 1


def test_hysteresis_holds_while_the_queue_is_late_and_resets_on_a_rise() -> None:
    h = Hysteresis(POLICY)
    h.update(load(4, 12, 0), now=0)  # 12 / 3.2 -> 4
    assert h.update(load(4, 1, 1, p95=1.5), now=1) == 4
    assert h.update(load(4, 1, 1, p95=1.5), now=40) == 4  # past the hold, jobs wait, p95 >= target / 2
    assert h.update(load(4, 1, 1, p95=0.5), now=41) == 1
    h.update(load(4, 12, 0), now=50)
    h.update(load(4, 2, 0, p95=9.0), now=51)
    assert h.update(load(4, 2, 0, p95=9.0), now=82) == 1  # nothing waits: a late p95 is history
    h2 = Hysteresis(POLICY)
    h2.update(load(4, 12, 0), now=0)
    h2.update(load(4, 2, 0), now=1)
    assert h2.update(load(4, 12, 0), now=20) == 4  # back to the size: the hold starts again
    assert h2.update(load(4, 2, 0), now=35) == 4
    assert h2.update(load(4, 2, 0), now=66) == 1


@pytest.mark.parametrize(
    "fields",
    [{"min_workers": 3, "max_workers": 2}, {"target_seat_use": 0}, {"wait_target_s": 0}, {"max_workers": 0}],
)
def test_bad_policy_refused(fields: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ScalePolicy(**fields)  # type: ignore[arg-type]


def test_spare_seats_and_growth_size_the_fleet_ahead() -> None:
    ahead = ScalePolicy(min_workers=1, max_workers=8, target_seat_use=0.8, spare_seats=4, growth_lead_s=10)
    assert raw_desired(ahead, load(1, 0, 0)) == 1  # idle: the minimum, spare seats or not
    assert raw_desired(ahead, load(1, 2, 0)) == 2  # (2 + 4) / 3.2 -> 2, where POLICY says 1
    assert raw_desired(ahead, load(1, 2, 0), growth_per_s=1.0) == 5  # (2 + 10 + 4) / 3.2
    assert raw_desired(ahead, load(1, 2, 0), growth_per_s=-3.0) == 2  # a fall: no growth


def test_hysteresis_measures_growth_between_updates() -> None:
    h = Hysteresis(ScalePolicy(min_workers=1, max_workers=8, target_seat_use=0.8, growth_lead_s=10))
    assert h.update(load(1, 1, 0), now=0) == 1
    assert h.update(load(1, 4, 3), now=5) == 6  # +6 jobs in 5 s: (7 + 1.2 x 10) / 3.2 -> 6
    assert h.update(load(6, 7, 0), now=10) == 6  # flat: 7 / 3.2 -> 3, held


@pytest.mark.parametrize("fields", [{"spare_seats": -1}, {"growth_lead_s": -1.0}])
def test_bad_lead_refused(fields: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ScalePolicy(**fields)  # type: ignore[arg-type]
