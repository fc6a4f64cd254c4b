"""Which large-batch GEMM the fused decoder stack runs, and up to how many rows a step runs it,
measured on this machine over one decoder layer's linears.

Above kvferry's GEMM crossover (crossover.py) the fused stack (csrc/decoder_layers.cpp) runs
its linears on ATen's GEMM (MKL) or on oneDNN's, while transformers' modules run oneDNN's
(packed_linear.py). Which of the two is faster at prefill-sized batches depends on the CPU (MKL's
kernels are tuned for Intel's), so each process times both, once per layer shape, at the row
counts of prefill chunks:
- oneDNN faster at the first count: the fused stack runs oneDNN's GEMM, the modules'
  own, and takes every step (it saves their ops and does the same arithmetic);
- else ATen's, and a step runs fused up to the last count where ATen kept up with oneDNN: above it
  a step is its GEMMs, where the modules' oneDNN linears are faster than the ops saved.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from workers.engine.kernels import timing

if TYPE_CHECKING:
    from workers.engine.kernels.packed_linear import SkinnyLinear

log = logging.getLogger(__name__)
ROWS = (128, 256, 512)  # the row counts timed, in order: prefill chunks beside the decodes
_ROUNDS = 2  # prefill-sized passes: long ones (timing.fastest), the first also sets oneDNN's kernel up

Gemm = Callable[["SkinnyLinear", torch.Tensor], object]
# (gemms, linears, rows) -> seconds of each gemm's pass over the linears, in order
Timer = Callable[[Sequence[Gemm], Sequence["SkinnyLinear"], int], list[float]]


@dataclass(frozen=True, slots=True)
class FusedPlan:
    onednn: bool  # the fused stack's large-batch linears run oneDNN's GEMM (else ATen's)
    max_rows: int | None  # a step of more rows keeps the modules' forward; None: no limit


def aten(m: SkinnyLinear, x: torch.Tensor) -> object:
    """What decoder_layers.cpp's aten_linear computes (addmm / mm over W^T)."""
    return torch.mm(x, m.weight.t()) if m.bias is None else torch.addmm(m.bias, x, m.weight.t())


def onednn(m: SkinnyLinear, x: torch.Tensor) -> object:
    return torch.ops.mkldnn._linear_pointwise(x, m.weight, m.bias, "none", [], "")


def race(gemms: Sequence[Gemm], linears: Sequence[SkinnyLinear], count: int) -> list[float]:
    """Each gemm's fastest pass over `linears` in turn at `count` rows, raced (timing.py)."""
    return timing.fastest([timing.over(linears, count, g) for g in gemms], rounds=_ROUNDS, warm=False)


def measure(
    linears: Sequence[SkinnyLinear], rows: Sequence[int] = ROWS, timer: Timer | None = None
) -> FusedPlan:
    """The plan for a stack of layers whose linears are `linears` (one layer's: every layer has
    the same shapes), timing ATen's GEMM against oneDNN's at each of `rows` in turn with `timer`
    (race); the first count where ATen falls behind ends the search. ATen, no limit, when
    oneDNN cannot be timed."""
    if not linears[0]._onednn:  # the modules' large GEMM is F.linear, ATen's own
        return FusedPlan(onednn=False, max_rows=None)
    timer = timer or race
    kept: int | None = None
    try:
        with torch.inference_mode():
            for count in rows:
                ours, theirs = timer((aten, onednn), linears, count)
                log.debug("%d rows: ATen %.1f ms, oneDNN %.1f ms", count, 1e3 * ours, 1e3 * theirs)
                if ours > theirs:
                    return FusedPlan(onednn=True, max_rows=None) if kept is None else FusedPlan(False, kept)
                kept = count
    except RuntimeError as err:  # an op missing from this build: ATen's GEMM, as the modules' F.linear
        log.warning("could not time ATen's GEMM against oneDNN here (%s)", err)
    return FusedPlan(onednn=False, max_rows=None)


_plans: dict[tuple[object, ...], FusedPlan] = {}
_lock = threading.Lock()


def plan(linears: Sequence[SkinnyLinear]) -> FusedPlan:
    """measure(linears), once per process for each set of shapes (a second engine of the same
    model, or of one of its size, reuses it)."""
    key = tuple((m.in_features, m.out_features, m.bias is not None, m._onednn) for m in linears)
    with _lock:
        if key not in _plans:
            _plans[key] = measure(linears)
            log.info("the fused stack's large GEMM here: %s", _plans[key])
        return _plans[key]
