"""bench tiers' pure parts: the multi-turn workload's TTFT quantiles (nearest rank) and the routing
ratios over back-to-back cache-aware / round-robin pairs."""

from __future__ import annotations

import math

from ops.bench.tiers.multiturn import _quantile


def test_nearest_rank_quantiles() -> None:
    values = [float(v) for v in range(1, 101)]
    assert _quantile(values, 0.5) == 51.0
    assert _quantile(values, 0.95) == 96.0
    assert _quantile([3.0], 0.95) == 3.0
    assert math.isnan(_quantile([], 0.5))


def test_routing_ratios_are_the_medians_of_back_to_back_pairs() -> None:
    from ops.bench.tiers.run import _routing_ratios

    def run(p50: float, p95: float) -> dict[str, float]:  # TPOT and wall: p50 / 2, p95 * 10
        return {"ttft_p50_s": p50, "ttft_p95_s": p95, "tpot_p50_s": p50 / 2, "wall_s": p95 * 10}

    no_tier = [run(9, 9), run(1, 1)]  # the first pass's set-ups without the Redis tier: never paired
    runs = [run(1, 2), run(2, 2), *no_tier, run(3, 1), run(1, 1), run(2, 4), run(4, 8)]
    out = _routing_ratios(runs, first_configs=4)
    assert out["cache_aware_vs_round_robin_ttft_p50_pairs"] == [0.5, 3.0, 0.5]
    assert out["cache_aware_vs_round_robin_ttft_p50"] == 0.5
    assert out["cache_aware_vs_round_robin_ttft_p95"] == 1.0  # pairs 1.0, 1.0, 0.5
    assert out["cache_aware_vs_round_robin_tpot_p50_pairs"] == [0.5, 3.0, 0.5]
    assert out["cache_aware_vs_round_robin_wall"] == 1.0
    assert _routing_ratios(runs[:2], first_configs=2)["cache_aware_vs_round_robin_ttft_p95_pairs"] == [1.0]
