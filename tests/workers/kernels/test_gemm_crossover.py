"""crossover.measure: the last row count at which kvferry's GEMM keeps up, stopping at the first
it loses; timed over stand-ins whose costs are known (a pure unit test of the search)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from workers.engine.kernels import crossover


class _Timed:
    """A linear whose two GEMMs sleep for a given cost of the row count."""

    in_features = 4

    def __init__(self, skinny_s: Callable[[int], float], large_s: Callable[[int], float]) -> None:
        self._skinny_s, self._large_s = skinny_s, large_s

    def skinny(self, rows: torch.Tensor) -> None:
        time.sleep(self._skinny_s(rows.shape[0]))

    def large(self, rows: torch.Tensor) -> None:
        time.sleep(self._large_s(rows.shape[0]))


def _measure(*linears: _Timed) -> int:
    found: Any = linears
    return crossover.measure(found)


def test_the_crossover_is_the_last_row_count_where_kvferrys_gemm_keeps_up() -> None:
    # kvferry's cost grows with the rows, the other's is flat at what kvferry takes for 56
    assert _measure(_Timed(lambda r: 1e-4 * r, lambda r: 56e-4)) == 48
    assert _measure(_Timed(lambda r: 1e-3, lambda r: 2e-3)) == crossover.ROWS[-1]  # always ahead
    assert _measure(_Timed(lambda r: 2e-3, lambda r: 1e-3)) == crossover.ROWS[0]  # never ahead


def test_every_linear_counts_and_the_first_loss_ends_the_search() -> None:
    # margins of ~1.5 ms a row count: sleep() overshoots on a loaded machine
    ahead, behind_at_64 = _Timed(lambda r: 1e-3, lambda r: 2e-3), _Timed(lambda r: 2e-4 * r, lambda r: 10e-3)
    assert _measure(ahead, behind_at_64) == 48  # 48 rows: 9.6 + 1 ms against 10 + 2; 64: 12.8 + 1 against 12
    # behind at 32, ahead again from 48 on: the search stops at 32
    wobbly = _Timed(lambda r: 3e-3 if r == 32 else 1e-3, lambda r: 2e-3)
    assert _measure(wobbly) == crossover.ROWS[0]


def test_a_gemm_that_cannot_run_leaves_the_decode_sized_batches_to_kvferry() -> None:
    def broken(rows: int) -> float:
        raise RuntimeError("no such op")

    assert _measure(_Timed(broken, lambda r: 1e-3)) == crossover.ROWS[0]
