"""Start-up races: which of a few ways of computing the same thing is fastest on the CPU at hand.

Each candidate runs once untimed (a first call sets up oneDNN's kernel for its shape), then the
candidates take turns, `rounds` times, in an order that rotates every round, and each keeps its
fastest pass. Another process can only slow a pass down (on a small machine it takes a core from
an OpenMP team mid-GEMM, and the whole team waits), never speed it up, so the fastest of many
interleaved passes compares the candidates as an idle machine would run them. Timing one
candidate's passes back to back and then the other's does not: a burst of other work (a stack's
api and Flower starting beside its worker) can cover all of one candidate's passes and none of the
other's, and the slower candidate wins for the process's whole life (a worker of `kvferry serve`
was seen picking bf16's slower weight layout that way: docs/benchmarks.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

ROUNDS = 9


def fastest(
    candidates: Sequence[Callable[[], object]],
    rounds: int = ROUNDS,
    clock: Callable[[], float] = time.perf_counter,
    warm: bool = True,
) -> list[float]:
    """The fastest pass of each candidate, seconds, in the candidates' order (module docstring).
    Long passes (a whole model's linears, prefill-sized rows) take fewer rounds and no warm-up
    (their first layer sets the kernels up for the rest): a burst covers fewer of them, and each
    costs the worker's start-up milliseconds."""
    if warm:
        for run in candidates:
            run()
    n = len(candidates)
    best = [float("inf")] * n
    for r in range(rounds):
        for k in range(n):
            i = (r + k) % n
            started = clock()
            candidates[i]()
            best[i] = min(best[i], clock() - started)
    return best


def over(
    linears: Sequence[Any], rows: int, apply: Callable[[Any, torch.Tensor], object]
) -> Callable[[], None]:
    """A candidate: one pass of `apply(linear, x)` over `linears` in turn, x a fixed input of
    `rows` rows of each linear's width (weights from memory, as in a step)."""
    inputs = {m.in_features: torch.randn(rows, m.in_features) for m in linears}

    def run() -> None:
        for m in linears:
            apply(m, inputs[m.in_features])

    return run
