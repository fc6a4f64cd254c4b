"""An int8 CPU engine's decoder linears (`--quantization int8`): weight-only, per-output-channel
symmetric int8, quantised at load time from the checkpoint's weights; fp32 in and out.

w[o, :] ~ q[o, :] * s[o], q in [-127, 127], s = max|w[o, :]| / 127 rounded to bf16 (the scale
torch's int8 kernel reads), q = round(w / s). Two kernels compute y = (x_bf16 q^T) * s + b, the
same products over the same int8 values, both accumulating in fp32:
- torch's `_weight_int8pack_mm` (reads the int8 weight: half the bytes of bf16);
- oneDNN's bf16 GEMM over q widened to bf16 (exact: |q| <= 127 fits bf16's mantissa), the
  scale applied to its output (bf16_linear.py's kernel, its layout timed there).
Which is faster depends on the row count and the CPU: on a Zen 4 EPYC (AVX512-BF16, VNNI, no AMX)
the int8 kernel took 0.75x oneDNN's time at 1 row and 1.1-2.5x from 4 rows up (docs/benchmarks.md).
So each process times both over the model's first layer at decode-step row counts (`choose`) and
runs the int8 kernel up to the last row count where it won (`max_int8_rows`, 0: never; then the
int8 copy is dropped), oneDNN's above. torchao's int8 weight-only tensors were measured too
(1.8-4x oneDNN's bf16 time at 1-64 rows: a Python tensor subclass over the same kinds of kernel)
and are not used. The activations, norms, residuals and attention stay fp32; lm_head is not
quantised (bf16, as a bf16 engine's: bf16_linear.convert_head).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch import nn

from workers.engine.kernels import bf16_linear, timing

log = logging.getLogger(__name__)
ROWS = (1, 2, 4, 8, 16)  # the decode-step row counts timed, in order


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [out, in], s bf16 [out]): per-output-channel symmetric, w ~ q * s."""
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1) / 127).clamp_min(1e-12).to(torch.bfloat16)
    q = torch.round(w / scale.float()[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scale.contiguous()


def runs() -> bool:
    """torch's int8 weight-only kernel and oneDNN's bf16 GEMM both run here."""
    if not bf16_linear.runs() or not hasattr(torch, "_weight_int8pack_mm"):
        return False
    try:
        q, s = quantize(torch.randn(32, 64))
        torch._weight_int8pack_mm(torch.randn(2, 64).to(torch.bfloat16), q, s)
    except RuntimeError:
        return False
    return True


class Int8Linear(nn.Module):
    """y = (x q^T) * s + b: torch's int8 kernel up to `max_int8_rows` rows, oneDNN's bf16 GEMM over
    q as bf16 above (`weight`, oneDNN's blocked layout when `packed`)."""

    def __init__(self, linear: nn.Linear, packed: bool, max_int8_rows: int) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        q, self.scales = quantize(linear.weight)
        self.scales_f = self.scales.float()
        dense = q.to(torch.bfloat16)
        self.weight = torch.ops.mkldnn._reorder_linear_weight(dense, None) if packed else dense
        self.bias = None if linear.bias is None else linear.bias.detach().float().contiguous()
        self.packed = packed
        self.max_int8_rows = max_int8_rows
        self.qweight = (
            q if max_int8_rows > 0 else torch.empty(0, dtype=torch.int8)
        )  # read by the int8 kernel only
        self.max_rows = 0  # kvferry's fp32 GEMM takes no rows (the fused stack reads this)
        self.nbytes = self.qweight.numel() + dense.numel() * 2 + self.scales.numel() * 6
        self.nbytes += 0 if self.bias is None else self.bias.numel() * 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        if rows.size(0) <= self.max_int8_rows:
            y = torch._weight_int8pack_mm(rows, self.qweight, self.scales).float()
        else:
            y = torch.ops.mkldnn._linear_pointwise(rows, self.weight, None, "none", [], "").float()
            y.mul_(self.scales_f)
        if self.bias is not None:
            y.add_(self.bias)
        return y.view(*shape[:-1], self.out_features).to(x.dtype)

    def dequantized(self) -> torch.Tensor:
        """fp32 q * s [out, in], the weight this module computes with."""
        q = self.qweight if self.max_int8_rows > 0 else self.weight
        if q.is_mkldnn:
            raise ValueError("the int8 copy was dropped and the bf16 one is in oneDNN's layout")
        return q.float() * self.scales_f[:, None]

    def extra_repr(self) -> str:
        layout = "oneDNN-packed" if self.packed else "plain"
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, int8 "
            f"(int8 kernel up to {self.max_int8_rows} rows, bf16 {layout} above)"
        )


def _call(module: Int8Linear, x: torch.Tensor) -> object:
    return module(x)


def choose(linears: Sequence[nn.Linear], packed: bool) -> int:
    """The last of ROWS up to which torch's int8 kernel beat oneDNN's bf16 GEMM (over `packed`
    weights) at every count, over `linears` (one layer's), raced here (kernels/timing.py); 0: at none."""
    with torch.inference_mode():
        int8 = [Int8Linear(lin, packed, max(ROWS)) for lin in linears]
        bf16 = [Int8Linear(lin, packed, 0) for lin in linears]
        chosen, times = 0, []
        for rows in ROWS:
            a, b = timing.fastest([timing.over(int8, rows, _call), timing.over(bf16, rows, _call)])
            times.append(f"{rows}: {1e3 * a:.2f}/{1e3 * b:.2f} ms")
            if a >= b:
                break
            chosen = rows
    log.info(
        "int8 linears: int8 kernel up to %d rows, oneDNN bf16 above (int8/bf16 %s)", chosen, ", ".join(times)
    )
    return chosen


def converted(model: nn.Module) -> bool:
    return any(isinstance(m, Int8Linear) for m in model.modules())


def convert(model: nn.Module) -> int:
    """Replace every decoder nn.Linear of `model` (on CPU) by an Int8Linear; how many were replaced
    (0: the kernels do not run here, the model is unchanged)."""
    linears = bf16_linear.decoder_linears(model)
    if not linears or not runs() or linears[0][1].weight.device.type != "cpu":
        return 0
    probe = [m for name, m in linears if ".layers.0." in name] or [m for _, m in linears[:7]]
    try:
        packed = bf16_linear.choose(probe) == bf16_linear.PACKED
        max_int8_rows = choose(probe, packed)
    except RuntimeError as err:  # an op missing from this build
        log.warning("the int8 or bf16 GEMM does not run here (%s)", err)
        return 0
    bf16_linear.replace_linears(model, linears, lambda linear: Int8Linear(linear, packed, max_int8_rows))
    return len(linears)


def int8_bytes(model: nn.Module) -> int:
    return sum(m.nbytes for m in model.modules() if isinstance(m, Int8Linear))
