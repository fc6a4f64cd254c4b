"""PackedLinear: a model's linear layers with their weights reordered once for oneDNN's GEMM (CPU).

A decode step multiplies a handful of rows by every weight of the model, so on CPU it is bound by
reading the weights, and MKL's sgemm behind `F.linear` reads a [out, in] weight at ~3-4 GB/s at
16 rows here. oneDNN reads the same weight, reordered once into its blocked layout, at ~6-7 GB/s:
measured on SmolLM2-135M's 210 decoder linears plus lm_head at 16 rows, 175 ms -> 105 ms a step.
vLLM's CPU backend packs its weights for oneDNN the same way. The op is the one inductor's CPU
freezing pass uses (`mkldnn::_linear_pointwise` over `_reorder_linear_weight`); where it is
missing, or a probe of it disagrees with `F.linear`, the model keeps its plain linears.

Results are not bitwise equal to MKL's (another summation order, ~1e-6 relative), like any change
of batch shape; greedy outputs stay token-exact against HF `generate`, which the engine tests check.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)
_PROBE_ROWS = 3


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


def supported(device: torch.device, dtype: torch.dtype) -> bool:
    """fp32 on CPU with oneDNN built in: where the packed GEMM was measured to pay."""
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def _agrees(linear: nn.Linear, packed: PackedLinear) -> bool:
    x = torch.randn(_PROBE_ROWS, linear.in_features, dtype=linear.weight.dtype)
    want = F.linear(x, linear.weight, linear.bias)
    return bool(torch.allclose(packed(x), want, rtol=1e-4, atol=1e-4 * float(want.abs().max()) + 1e-6))


def pack_linears(model: nn.Module) -> int:
    """Replace every nn.Linear of `model` by a PackedLinear, where supported; returns how many were
    packed (0: the model is unchanged). Idempotent: packed layers are no longer nn.Linear."""
    linears = [(name, m) for name, m in model.named_modules() if type(m) is nn.Linear]
    if not linears:
        return 0
    first = linears[0][1]
    if not supported(first.weight.device, first.weight.dtype):
        return 0
    try:
        with torch.inference_mode():
            if not _agrees(first, PackedLinear(first)):
                log.warning("oneDNN's packed linear disagrees with F.linear here; keeping plain linears")
                return 0
    except RuntimeError as exc:  # an op missing from this build's oneDNN
        log.warning("could not pack linears for oneDNN (%s); keeping plain linears", exc)
        return 0
    with torch.inference_mode():
        for name, linear in linears:
            parent_name, _, attr = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, attr, PackedLinear(linear))
    return len(linears)


def packed_bytes(model: nn.Module) -> int:
    return sum(m.nbytes for m in model.modules() if isinstance(m, PackedLinear))
