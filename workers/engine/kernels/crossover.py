"""Where kvferry's decode-step GEMM stops paying, measured on this machine over the model's weights.

kvferry's GEMM (csrc/skinny_gemm.cpp) reads each weight once per 16 rows, so it wins while a step
is bound by reading the weights; with more rows the product becomes bound by arithmetic, where
oneDNN's blocked kernels (AVX-512 and AMX where the CPU has them) win. Where that happens depends
on the CPU (docs/benchmarks.md has it per machine kind; `kvferry bench gemm`). So each worker
times both over its own decoder linears once, when they are swapped in, and each step picks by
its row count.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

import torch

from workers.engine.kernels import timing

log = logging.getLogger(__name__)


class TimedLinear(Protocol):
    """A linear with both GEMMs at hand (packed_linear.SkinnyLinear)."""

    in_features: int

    def skinny(self, rows: torch.Tensor) -> torch.Tensor: ...

    def large(self, x: torch.Tensor) -> torch.Tensor: ...


ROWS = (16, 32, 48, 64, 96, 128)  # the row counts timed, in order; the first is always kvferry's
_ROUNDS = 3  # each pass is every linear of the model: a long pass (timing.fastest)


def measure(linears: Sequence[TimedLinear], rows: Sequence[int] = ROWS) -> int:
    """The most of `rows` up to which kvferry's GEMM is as fast as the large-batch path over every
    one of `linears` in turn (weights from memory, as in a step), raced (timing.py); the first of
    `rows` where it falls behind ends the search. rows[0] when nothing can be timed."""
    chosen = rows[0]
    try:
        with torch.inference_mode():
            for count in rows[1:]:
                skinny, large = timing.fastest(
                    [
                        timing.over(linears, count, lambda m, x: m.skinny(x)),
                        timing.over(linears, count, lambda m, x: m.large(x)),
                    ],
                    rounds=_ROUNDS,
                    warm=False,
                )
                log.debug(
                    "%d rows: kvferry %.1f ms, large-batch GEMM %.1f ms", count, 1e3 * skinny, 1e3 * large
                )
                if skinny > large:
                    break
                chosen = count
    except RuntimeError as err:  # an op missing from this build: the decode-sized batches stay ours
        log.warning("could not time kvferry's GEMM against oneDNN here (%s)", err)
    return chosen
