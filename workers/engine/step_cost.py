"""StepCost: what an engine step costs on the CPU at hand, measured from the engine's own steps.

The model is t(d, p) = t_decode + c * p: a step of d decodes costs about what the recent
decode-only steps cost (the weights are read once per step, so d moves it little), and each
prefill row beside them adds c seconds. Both are exponential averages of timed steps, so they
follow the machine as it is now (other processes on the cores, the batch the load gives), not a
figure taken once on a quiet machine. The scheduler's admission hold (scheduler.py) predicts from
it what holding a new prompt one more step and then prefilling the waiting ones costs their
TTFT. It also sums the seconds spent in decode-only steps and in steps carrying prefill rows: how
much of the served TPOT the prefills set (`kvferry bench served-decode`).
"""

from __future__ import annotations

from dataclasses import dataclass

_WEIGHT = 0.2  # each new sample's share of the averages: about the last ten steps count


@dataclass(slots=True)
class StepCost:
    decode_s: float | None = None  # a decode-only step, recent average
    prefill_row_s: float | None = None  # one prefill row beside decodes, recent average
    seconds_decode_only: float = 0.0  # all decode-only steps so far
    seconds_with_prefill: float = 0.0  # all steps that computed prompt (or recompute) rows

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
            return
        self.seconds_with_prefill += seconds
        base = self.decode_s if self.decode_s is not None and num_decodes else 0.0
        self.prefill_row_s = _avg(self.prefill_row_s, max(seconds - base, 0.0) / num_prefill)

    def predict(self, num_prefill: int) -> float:
        """Seconds of a step carrying the current decodes and `num_prefill` prefill rows."""
        return (self.decode_s or 0.0) + (self.prefill_row_s or 0.0) * num_prefill


def _avg(old: float | None, new: float) -> float:
    return new if old is None else old + _WEIGHT * (new - old)
