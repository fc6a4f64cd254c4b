"""How sure a routing comparison of the realistic workload is (ops/bench/tiers/realistic.py): its
headline is the median over back-to-back pairs of one ratio (cache-aware over round-robin), and the
machine's speed moves between runs. Beside it: a seeded bootstrap interval of that median, the
ratio of the pooled turns' medians, and the median gap between the same turn under each routing."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

RESAMPLES = 2000


def median(values: Sequence[float]) -> float:
    """The headline's median: of an even count, the upper of the middle two."""
    return sorted(values)[len(values) // 2]


def median_interval(ratios: Sequence[float], level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap interval of the median of `ratios` (one per pair): the pairs are
    resampled with replacement. With one pair, that pair's ratio at both ends."""
    if not ratios:
        return float("nan"), float("nan")
    rng = random.Random(seed)
    medians = sorted(median(rng.choices(ratios, k=len(ratios))) for _ in range(RESAMPLES))
    tail = (1 - level) / 2
    return medians[int(tail * (RESAMPLES - 1))], medians[int((1 - tail) * (RESAMPLES - 1))]


def pooled_ratio(pairs: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> float:
    """The median TTFT of every turn of the first routing's runs over that of the second's."""
    first = [r["ttft_s"] for a, _ in pairs for r in a["turn_rows"]]
    second = [r["ttft_s"] for _, b in pairs for r in b["turn_rows"]]
    if not first or not second:
        return float("nan")
    return median(first) / median(second)


def matched_gap_s(pairs: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> float:
    """The median over the pairs' turns of (TTFT under the first routing − under the second) for
    the same session and turn in the same pair: negative where the first is faster."""
    gaps: list[float] = []
    for a, b in pairs:
        other = {(r["sid"], r["turn"]): r["ttft_s"] for r in b["turn_rows"]}
        for r in a["turn_rows"]:
            if (r["sid"], r["turn"]) in other:
                gaps.append(r["ttft_s"] - other[(r["sid"], r["turn"])])
    return median(gaps) if gaps else float("nan")
