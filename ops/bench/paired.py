"""Ours against a baseline, in alternated pairs: the one rule every `*_vs_*` ratio of the benches
follows. Each pair runs ours, then the baseline, right after one another, so that the machine's
drift (other load, clocks, caches) hits both sides of a pair alike; both sides run the same number
of times; the ratio is the median of the pairs' own ratios, and every pair is reported with it. A
best-of-N on one side against fewer runs on the other would lean the ratio toward that side."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Pairs:
    """Measures of ours and of the baseline, pair by pair (ours[i] was taken right before
    baseline[i]). A measure is whatever the ratio compares: seconds, tokens per second."""

    ours: tuple[float, ...]
    baseline: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.ours or len(self.ours) != len(self.baseline):
            raise ValueError(f"pairs need equal, non-zero counts: {len(self.ours)} vs {len(self.baseline)}")

    @classmethod
    def of(cls, ours: Sequence[float], baseline: Sequence[float]) -> Pairs:
        return cls(tuple(ours), tuple(baseline))

    @property
    def ratios(self) -> list[float]:
        return [o / b for o, b in zip(self.ours, self.baseline, strict=True)]

    @property
    def ratio(self) -> float:
        """Median of the pairs' ratios, ours / baseline."""
        return statistics.median(self.ratios)

    @property
    def ours_median(self) -> float:
        return statistics.median(self.ours)

    @property
    def baseline_median(self) -> float:
        return statistics.median(self.baseline)

    def table(self) -> list[dict[str, float]]:
        """Every pair, for the JSON report."""
        return [
            {"ours": o, "baseline": b, "ratio": o / b} for o, b in zip(self.ours, self.baseline, strict=True)
        ]


def alternate(
    ours: Callable[[], float],
    baseline: Callable[[], float],
    pairs: int,
    between: Callable[[], object] | None = None,
    warmup: bool = True,
) -> Pairs:
    """`pairs` alternated pairs (ours, baseline, ours, baseline, ...); `between` runs after every
    measure (e.g. emptying a prefix cache). `warmup`: one untimed run of each first, so that
    neither side's first measure carries one-time costs the other's does not."""
    if pairs < 1:
        raise ValueError(f"pairs must be at least 1, not {pairs}")
    if warmup:
        for fn in (ours, baseline):
            fn()
            if between is not None:
                between()
    got: tuple[list[float], list[float]] = ([], [])
    for _ in range(pairs):
        for side, fn in zip(got, (ours, baseline), strict=True):
            side.append(fn())
            if between is not None:
                between()
    return Pairs.of(*got)
