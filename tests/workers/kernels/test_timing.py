"""timing.fastest: candidates raced in rotating turns keep their fastest pass, so a burst of other
work that slows several passes in a row does not make the slower candidate win."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from workers.engine.kernels import timing


class _Machine:
    """A fake clock: each candidate's pass advances it by the candidate's cost, plus a burst's
    extra while passes numbered in `burst` run (the count starts at the first timed pass)."""

    def __init__(self, burst: range, extra: float) -> None:
        self.now, self.passes, self.burst, self.extra = 0.0, -1, burst, extra
        self.ran: list[str] = []

    def candidate(self, name: str, cost: float) -> Callable[[], None]:
        def run() -> None:
            self.passes += 1
            self.ran.append(name)
            self.now += cost + (self.extra if self.passes in self.burst else 0.0)

        return run


def test_a_burst_over_consecutive_passes_does_not_flip_the_choice() -> None:
    # Passes 2..5 (after the two untimed warm-ups): back-to-back timing of A's three passes and
    # then B's would see every A pass slowed and pick B; raced, A keeps a clean pass.
    machine = _Machine(burst=range(2, 6), extra=0.02)
    fast, slow = machine.candidate("a", 0.001), machine.candidate("b", 0.002)
    a, b = timing.fastest([fast, slow], rounds=5, clock=lambda: machine.now)
    assert (a, b) == (pytest.approx(0.001), pytest.approx(0.002))
    assert machine.ran[:2] == ["a", "b"], "each runs once untimed first"
    assert machine.ran[2:6] == ["a", "b", "b", "a"], "the order rotates every round"
    assert len(machine.ran) == 2 + 2 * 5


def test_a_lone_candidate_and_a_single_round() -> None:
    machine = _Machine(burst=range(0), extra=0.0)
    assert timing.fastest([machine.candidate("a", 0.003)], rounds=1, clock=lambda: machine.now) == [
        pytest.approx(0.003)
    ]


def test_long_passes_skip_the_warm_up() -> None:
    machine = _Machine(burst=range(0), extra=0.0)
    fast, slow = machine.candidate("a", 0.004), machine.candidate("b", 0.005)
    assert timing.fastest([fast, slow], rounds=2, clock=lambda: machine.now, warm=False) == [
        pytest.approx(0.004),
        pytest.approx(0.005),
    ]
    assert machine.ran == ["a", "b", "b", "a"], "as many passes as rounds, none untimed"
