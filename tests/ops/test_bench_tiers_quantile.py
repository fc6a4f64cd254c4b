"""The multi-turn workload's TTFT quantiles (ops/bench/tiers/multiturn.py): nearest rank."""

from __future__ import annotations

import math

from ops.bench.tiers.multiturn import _quantile


def test_nearest_rank_quantiles() -> None:
    values = [float(v) for v in range(1, 101)]
    assert _quantile(values, 0.5) == 51.0
    assert _quantile(values, 0.95) == 96.0
    assert _quantile([3.0], 0.95) == 3.0
    assert math.isnan(_quantile([], 0.5))
