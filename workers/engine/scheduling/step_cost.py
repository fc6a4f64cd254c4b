"""StepCost: what an engine step costs on the CPU at hand, measured from the engine's own steps.

The model is t(d, p) = t_decode + c * p: a step of d decodes costs about what the recent
decode-only steps cost (the weights are read once per step, so d moves it little), and each
prefill row beside them adds c seconds. Both are exponential averages of timed steps, so they
follow the machine as it is now (other processes on the cores, the batch the load gives), not a
figure taken once on a quiet machine. The scheduler's admission hold (scheduler.py) predicts from
it what holding a new prompt one more step and then prefilling the waiting ones costs their
TTFT. It also sums the seconds spent in decode-only steps and in steps carrying prefill rows: how
much of the served TPOT the prefills set (`kvferry bench served-decode`).

On a CPU d does move a decode step (each row is a matrix-vector pass over the weights' cache
lines, and its attention): the batch sizing (batch_budget.py) needs a row's own cost, so the
decode-only steps are also fitted as t(d) = base + row * d, least squares over the last
_FIT_STEPS of them, refitted only when their d spread enough to tell the two apart (the last
fit is kept otherwise, as when the sizing itself holds d steady).

What a step costs is read on `clock`: wall time by default; the engine thread's CPU time where
that thread does all of a step's work (a CPU engine with one torch thread: factory.py). On a busy
machine a step's wall time is mostly its wait for a core, which comes and goes with the other
processes: the row fit then found a base of most of a step and a row of almost nothing, and the
batch sizing let whole batch steps through (the 2-worker `kvferry bench batch`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

_WEIGHT = 0.2  # each new sample's share of the averages: about the last ten steps count
_FIT_STEPS = 64  # decode-only steps the row fit looks at
_FIT_SPREAD = 2  # their d must span at least this many rows for a new fit


@dataclass(slots=True)
class StepCost:
    decode_s: float | None = None  # a decode-only step, recent average
    prefill_row_s: float | None = None  # one prefill row beside decodes, recent average
    seconds_decode_only: float = 0.0  # all decode-only steps so far
    seconds_with_prefill: float = 0.0  # all steps that computed prompt (or recompute) rows
    decode_base_s: float = 0.0  # the fit's fixed part of a decode-only step
    decode_row_s: float | None = None  # the fit's cost of one decode row
    _recent: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=_FIT_STEPS))
    clock: Callable[[], float] = time.perf_counter  # what the engine times its steps with

    @property
    def ready(self) -> bool:
        """Both kinds of step have been timed at least once."""
        return self.decode_s is not None and self.prefill_row_s is not None

    def record(self, num_decodes: int, num_prefill: int, seconds: float) -> None:
        """One step's measured wall time, with its decode and prefill row counts."""
        if num_prefill == 0:
            self.seconds_decode_only += seconds
            if num_decodes:
                self.decode_s = _avg(self.decode_s, seconds)
                self._recent.append((num_decodes, seconds))
                self._fit()
            return
        self.seconds_with_prefill += seconds
        base = self.decode_s if self.decode_s is not None and num_decodes else 0.0
        self.prefill_row_s = _avg(self.prefill_row_s, max(seconds - base, 0.0) / num_prefill)

    def predict(self, num_prefill: int) -> float:
        """Seconds of a step carrying the current decodes and `num_prefill` prefill rows."""
        return (self.decode_s or 0.0) + (self.prefill_row_s or 0.0) * num_prefill

    def _fit(self) -> None:
        ds = [d for d, _ in self._recent]
        if max(ds) - min(ds) < _FIT_SPREAD:
            if self.decode_row_s is None:  # no fit yet: all of a step on its rows (an upper bound)
                self.decode_row_s = sum(t for _, t in self._recent) / sum(ds)
            return
        n = len(ds)
        mean_d, mean_t = sum(ds) / n, sum(t for _, t in self._recent) / n
        var = sum((d - mean_d) ** 2 for d in ds)
        slope = sum((d - mean_d) * (t - mean_t) for d, t in self._recent) / var
        if slope > 0:
            self.decode_row_s = slope
            self.decode_base_s = max(0.0, mean_t - slope * mean_d)

    def predict_rows(self, num_decodes: int, num_prefill: int = 0) -> float:
        """Seconds of a step of `num_decodes` decode rows and `num_prefill` prefill rows, by the
        row fit (0 for what is not timed yet)."""
        return (
            self.decode_base_s
            + (self.decode_row_s or 0.0) * num_decodes
            + (self.prefill_row_s or 0.0) * num_prefill
        )


def _avg(old: float | None, new: float) -> float:
    return new if old is None else old + _WEIGHT * (new - old)
