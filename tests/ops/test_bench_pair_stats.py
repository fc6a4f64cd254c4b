"""The realistic workload's confidence figures (ops/bench/tiers/pair_stats.py)."""

from __future__ import annotations

from typing import Any

from ops.bench.tiers import pair_stats


def _run(ttfts: dict[tuple[str, int], float]) -> dict[str, Any]:
    return {"turn_rows": [{"sid": s, "turn": t, "ttft_s": v} for (s, t), v in ttfts.items()]}


def test_the_median_is_the_headlines_upper_middle() -> None:
    assert pair_stats.median([3.0, 1.0, 2.0]) == 2.0
    assert pair_stats.median([4.0, 1.0, 3.0, 2.0]) == 3.0


def test_the_interval_holds_the_median_and_narrows_with_agreeing_pairs() -> None:
    spread = [0.9, 0.95, 1.0, 1.05, 1.1, 1.2, 0.8, 1.0]
    low, high = pair_stats.median_interval(spread)
    assert low <= pair_stats.median(spread) <= high
    assert (low, high) == pair_stats.median_interval(spread)  # seeded
    assert 0.8 <= low < 1.0 < high <= 1.2
    assert pair_stats.median_interval([0.97] * 8) == (0.97, 0.97)
    assert pair_stats.median_interval([1.3]) == (1.3, 1.3)


def test_pooled_and_matched_figures_compare_the_same_turns() -> None:
    fast = _run({("a", 0): 0.10, ("a", 1): 0.20, ("b", 0): 0.30})
    slow = _run({("a", 0): 0.15, ("a", 1): 0.20, ("b", 0): 0.45})
    pairs = [(fast, slow), (fast, slow)]
    assert pair_stats.pooled_ratio(pairs) == 0.20 / 0.20
    assert pair_stats.matched_gap_s(pairs) < 0  # the first routing is faster turn for turn
    assert abs(pair_stats.matched_gap_s([(fast, slow)]) + 0.05) < 1e-9
    assert abs(pair_stats.matched_gap_s([(slow, fast)]) - 0.05) < 1e-9
