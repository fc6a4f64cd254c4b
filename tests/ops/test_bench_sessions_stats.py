"""`kvferry bench sessions`' pure parts: percentiles, per-turn figures, the SLO verdict, the
capacity search (doubling then bisection, bounded by --max-sessions), the seeded workload."""

from __future__ import annotations

import math

import pytest

from ops.bench.sessions.capacity import find_capacity
from ops.bench.sessions.stats import Record, meets, per_turn, percentile, summary, sure_miss
from ops.bench.sessions.workload import plan_sessions, system_prompts

NAN = float("nan")


def _rec(turn: int, ttft: float, tpot: float = 0.05, cached: int | None = None, error: str = "") -> Record:
    return Record(2, "s", turn, ttft, tpot, 100 * turn, cached, 32, "w1", error, False)


def test_percentile_interpolates_and_skips_nan() -> None:
    assert percentile([], 95) is None
    assert percentile([NAN], 50) is None
    assert percentile([3.0], 95) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0, NAN], 50) == pytest.approx(2.5)
    assert percentile([float(i) for i in range(1, 101)], 95) == pytest.approx(95.05)


def test_per_turn_is_one_based_and_leaves_errors_out() -> None:
    records = [
        _rec(1, 1.0, cached=0),
        _rec(1, 3.0, cached=0),
        _rec(2, 0.5, cached=300),
        _rec(2, 9.0, error="500 x"),
    ]
    rows = per_turn(records, 3)
    assert [r["turn"] for r in rows] == ["turn1", "turn2", "turn3"]
    assert rows[0]["ttft_p50_s"] == pytest.approx(2.0) and rows[0]["cached_tokens_mean"] == 0
    assert rows[1]["ttft_p95_s"] == 0.5 and rows[1]["errors"] == 1 and rows[1]["cached_tokens_mean"] == 300
    assert rows[2]["requests"] == 0 and rows[2]["ttft_p95_s"] is None


def test_cached_tokens_are_null_when_the_server_never_said() -> None:
    assert per_turn([_rec(1, 1.0), _rec(1, 2.0)], 1)[0]["cached_tokens_mean"] is None


def test_summary_keys_and_turn_ratios() -> None:
    records = [_rec(t, 0.1 * t) for t in range(1, 9)]
    out = summary(records, 1, 8)
    for key in ("sessions", "turns", "per_turn", "ttft_p95_s", "tpot_p95_s", "ttft_p50_s", "tpot_p50_s",
                "stopped_short", "errors", "ttft_p95_turn8_vs_turn1", "ttft_p95_last_vs_turn1"):  # fmt: skip
        assert key in out
    assert out["ttft_p95_turn8_vs_turn1"] == pytest.approx(8.0)
    short = summary([_rec(1, 0.2), _rec(2, 0.3)], 1, 2)
    assert short["ttft_p95_turn8_vs_turn1"] is None
    assert short["ttft_p95_last_vs_turn1"] == pytest.approx(1.5)


def test_meets_needs_both_slos_no_errors_and_no_cutoff() -> None:
    level = summary([_rec(1, 1.0, tpot=0.1), _rec(2, 1.5, tpot=0.2)], 1, 2)
    assert meets(level, 2.0, 0.25)
    assert not meets(level, 1.2, 0.25)  # TTFT p95 1.475 s
    assert not meets(level, 2.0, 0.15)  # TPOT p95 0.195 s
    assert not meets({**level, "timed_out": True}, 2.0, 0.25)
    assert not meets(summary([_rec(1, 1.0), _rec(2, 1.0, error="429")], 1, 2), 2.0, 0.25)


def test_sure_miss_fires_exactly_when_the_p95_can_no_longer_meet() -> None:
    slow = [_rec(1, 5.0)] * 3
    assert not sure_miss(slow[:2], 24, 2.0, 0.25)
    assert sure_miss(slow, 24, 2.0, 0.25)
    # however fast the other 21 are, the level's p95 is then past the SLO; with 2 slow it need not be
    assert percentile([0.0] * 21 + [5.0] * 3, 95) > 2.0  # type: ignore[operator]
    assert percentile([0.0] * 22 + [2.1] * 2, 95) <= 2.0  # type: ignore[operator]
    assert sure_miss([_rec(1, 0.1, tpot=1.0)] * 3, 24, 2.0, 0.25)
    assert sure_miss([_rec(1, 0.1, error="500")], 24, 2.0, 0.25)


@pytest.mark.parametrize(
    ("capacity", "max_sessions", "tried", "best"),
    [
        (0, 64, [1], 0),
        (1, 64, [1, 2], 1),
        (64, 64, [1, 2, 4, 8, 16, 32, 64], 64),
        (100, 48, [1, 2, 4, 8, 16, 32, 48], 48),
        (5, 64, [1, 2, 4, 8, 6, 5], 5),
        (23, 64, [1, 2, 4, 8, 16, 32, 24, 20, 22, 23], 23),
    ],
)
def test_capacity_doubles_then_bisects(capacity: int, max_sessions: int, tried: list[int], best: int) -> None:
    levels, found = find_capacity(lambda n: n <= capacity, max_sessions)
    assert [n for n, _ in levels] == tried
    assert found == best
    assert all(ok == (n <= capacity) for n, ok in levels)


def test_the_workload_is_seeded_and_levels_do_not_share_histories() -> None:
    systems = system_prompts(4)
    words = [len(s.split()) for s in systems]
    assert words == sorted(words) and len(set(systems)) == 4
    a = plan_sessions(0, 5, 3, 1.0, 7, systems)
    assert a == plan_sessions(0, 5, 3, 1.0, 7, systems)
    b = plan_sessions(1, 5, 3, 1.0, 7, systems)
    assert {p.sid for p in a}.isdisjoint(p.sid for p in b)
    assert not {u for p in a for u in p.users} & {u for p in b for u in p.users}
    assert [p.system for p in a] == [systems[i % 4] for i in range(5)] == [p.system for p in b]
    assert all(0 <= p.start_delay_s <= 1.0 and len(p.thinks_s) == 2 for p in a)
    thinks = [t for p in plan_sessions(0, 400, 2, 1.0, 0, systems) for t in p.thinks_s]
    assert sum(thinks) / len(thinks) == pytest.approx(1.0, rel=0.15)
    assert all(not math.isnan(t) and t >= 0 for t in thinks)
