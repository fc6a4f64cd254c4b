"""The model's linear layers on a CPU GEMM that fits a decode step (CPU fp32).

A decode step multiplies a handful of rows by every weight of the model, so on CPU it is bound by
reading the weights. MKL's sgemm behind `F.linear` over a [out, in] weight, and oneDNN over the
same weight reordered once into its blocked layout (vLLM's CPU backend packs its weights for oneDNN
the same way), block for a reuse that a handful of rows cannot give, and read the weights well
below what the memory gives; kvferry's own GEMM (csrc/skinny_gemm.cpp, each weight read once per
16 rows) reads them near the memory's own rate (`kvferry bench gemm`; docs/benchmarks.md).

So, in order of preference:
- SkinnyLinear, where kvferry's CPU kernels build (build.py): the model's own weight, no
  copy; up to a row count measured on this machine at start-up (crossover.py; at most
  SKINNY_MAX_ROWS) by kvferry::skinny_linear, larger batches (prefill chunks) by oneDNN over the
  same dense weight in its plain layout (as fast as over packed weights there);
  a layer whose weight the kernel cannot read as it is (strided, another dtype) goes to oneDNN;
- PackedLinear: the weight reordered once for oneDNN (`mkldnn::_linear_pointwise` over
  `_reorder_linear_weight`, the op inductor's CPU freezing pass uses), where our kernels do not
  build;
- else the model keeps its plain linears. Each is probed against `F.linear` first.

Results are not bitwise equal to MKL's (another summation order, ~1e-6 relative), like any change
of batch shape; greedy outputs stay token-exact against HF `generate`, which the engine tests check.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from workers.engine.kernels import build, crossover

log = logging.getLogger(__name__)
KVFERRY = "kvferry"
ONEDNN = "onednn"
# The most rows kvferry's GEMM may take. Where it stops leading oneDNN depends on the CPU (AVX-512
# and AMX favour oneDNN's blocked kernels: docs/benchmarks.md), so each model's crossover is
# measured when its linears are swapped (crossover.py), up to this.
SKINNY_MAX_ROWS = 128
_PROBE_ROWS = (3, 16, 21, SKINNY_MAX_ROWS + 5)  # a partial chunk, a full one, both, and oneDNN's path


def _onednn_runs() -> bool:
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


class SkinnyLinear(nn.Module):
    """y = x W^T + b over the linear's own weight and bias (tied weights stay tied). For linears
    whose weight and bias the kernel reads as they are: see `fits`."""

    @staticmethod
    def fits(linear: nn.Linear) -> bool:
        return all(
            t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous()
            for t in (linear.weight, linear.bias)
            if t is not None
        )

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.max_rows = SKINNY_MAX_ROWS  # above: the large-batch GEMM (set by pack_linears)
        self._onednn = _onednn_runs()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] > self.max_rows:
            return self.large(x)
        return self.skinny(rows).view(*x.shape[:-1], self.out_features)

    def skinny(self, rows: torch.Tensor) -> torch.Tensor:
        """kvferry's GEMM over [rows, in]."""
        return torch.ops.kvferry.skinny_linear(rows.contiguous(), self.weight, self.bias)

    def large(self, x: torch.Tensor) -> torch.Tensor:
        """oneDNN over the same dense weight (F.linear without it): for prefill-sized batches."""
        if self._onednn:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kvferry GEMM"


class PackedLinear(nn.Module):
    """y = x W^T + b with W in oneDNN's layout. Holds no dense copy of W: the model's memory stays
    one copy of its weights (lm_head tied to the embeddings adds one)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.nbytes = sum(t.numel() * t.element_size() for t in (weight, self.bias) if t is not None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN-packed"


_MODULES: dict[str, type[nn.Module]] = {KVFERRY: SkinnyLinear, ONEDNN: PackedLinear}


def _runs(gemm: str) -> bool:
    return build.built() if gemm == KVFERRY else _onednn_runs()


def supported(device: torch.device, dtype: torch.dtype) -> bool:
    """fp32 on CPU, where the GEMMs were measured to pay, and one of them runs here."""
    return device.type == "cpu" and dtype == torch.float32 and any(_runs(g) for g in _MODULES)


def _agrees(linear: nn.Linear, gemm: str) -> bool:
    module = _MODULES[gemm](linear)
    for rows in _PROBE_ROWS:
        x = torch.randn(rows, linear.in_features, dtype=linear.weight.dtype)
        want = F.linear(x, linear.weight, linear.bias)
        if not torch.allclose(module(x), want, rtol=1e-4, atol=1e-4 * float(want.abs().max()) + 1e-6):
            log.warning("the %s linear disagrees with F.linear here", gemm)
            return False
    return True


def _choose(linear: nn.Linear, gemms: tuple[str, ...]) -> str | None:
    """The first of `gemms` that runs here and agrees with F.linear on this layer."""
    for gemm in gemms:
        if not _runs(gemm):
            continue
        try:
            with torch.inference_mode():
                if _agrees(linear, gemm):
                    return gemm
        except RuntimeError as exc:  # an op missing from this build, a library of another signature
            log.warning("could not run the %s linear here (%s)", gemm, exc)
    return None


def pack_linears(model: nn.Module, gemms: tuple[str, ...] = (KVFERRY, ONEDNN)) -> int:
    """Replace every nn.Linear of `model` by the module of the first of `gemms` that works here;
    returns how many were replaced (0: the model is unchanged). Idempotent: replaced layers are no
    longer nn.Linear."""
    linears = [(name, m) for name, m in model.named_modules() if type(m) is nn.Linear]
    if not linears:
        return 0
    first = linears[0][1]
    if not supported(first.weight.device, first.weight.dtype):
        return 0
    gemm = _choose(first, gemms)
    if gemm is None:
        log.warning("no CPU GEMM agrees with F.linear here; keeping plain linears")
        return 0
    replaced = 0
    skinny: list[SkinnyLinear] = []
    with torch.inference_mode():
        for name, linear in linears:
            chosen: str | None = gemm
            if gemm == KVFERRY and not SkinnyLinear.fits(linear):  # a strided or foreign weight
                chosen = ONEDNN if _onednn_runs() else None
            if chosen is None:
                continue
            parent_name, _, attr = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            module = _MODULES[chosen](linear)
            setattr(parent, attr, module)
            replaced += 1
            if isinstance(module, SkinnyLinear):
                skinny.append(module)
        if skinny:
            max_rows = crossover.measure(skinny)
            log.info("kvferry's GEMM takes up to %d rows a step here (oneDNN above)", max_rows)
            for module in skinny:
                module.max_rows = max_rows
    return replaced


def packed_bytes(model: nn.Module) -> int:
    return sum(m.nbytes for m in model.modules() if isinstance(m, PackedLinear))
