"""A bf16 CPU engine's decoder linears: bf16 weights on oneDNN's bf16 GEMM (AVX512-BF16 or AMX),
fp32 in and out.

A decode step reads every weight of the model for a handful of rows, so halving the weights' bytes
is what pays; oneDNN's bf16 kernels accumulate in fp32. Measured against kvferry's fp32 GEMM at 1
to 16 rows over SmolLM2's decoder linears on a Zen 4 EPYC: 0.57-0.77x the time with the weight
reordered once into oneDNN's blocked layout, 0.85-1.12x over the plain [out, in] weight
(docs/benchmarks.md). Which of the two layouts a process uses is timed at start-up over the
model's first layer (`choose`), as the fp32 crossover is (crossover.py). The activations, norms,
residuals and attention stay fp32 (the input is rounded to bf16 for the product, the output
widened back). lm_head gets a bf16 copy of its own (`convert_head`; the embeddings it may be tied
to stay fp32 for the lookup): at a decode step it reads more bytes than any decoder layer, so the
logits come from oneDNN's bf16 GEMM too, accumulated in fp32 and rounded to bf16 as the decoder
linears' outputs are (as vLLM's and transformers' bf16 models give them), then widened to fp32 for
sampling and logprobs. Its layout is timed over the head itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torch import nn

from workers.engine.kernels import packed_linear, timing

log = logging.getLogger(__name__)
PACKED = "packed"
PLAIN = "plain"
_ROWS = (1, 16)  # decode-step row counts timed


def runs() -> bool:
    """oneDNN's reorder and linear ops are in this torch (the fp32 packed linears' check)."""
    return packed_linear._onednn_runs()


class Bf16Linear(nn.Module):
    """y = x W^T + b with W in bf16 (oneDNN's blocked layout when `packed`), x and y fp32."""

    def __init__(self, linear: nn.Linear, packed: bool) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        dense = linear.weight.detach().to(torch.bfloat16).contiguous()
        self.weight = torch.ops.mkldnn._reorder_linear_weight(dense, None) if packed else dense
        self.bias = None if linear.bias is None else linear.bias.detach().float().contiguous()
        self.packed = packed
        self.max_rows = 0  # kvferry's fp32 GEMM takes no rows (the fused stack reads this)
        self.nbytes = dense.numel() * 2 + (0 if self.bias is None else self.bias.numel() * 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), self.weight, self.bias, "none", [], "")
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        layout = "oneDNN-packed" if self.packed else "plain"
        return f"in_features={self.in_features}, out_features={self.out_features}, bf16 {layout}"


class _Linear(Protocol):
    in_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


def _call(module: _Linear, x: torch.Tensor) -> object:
    return module(x)


def choose(linears: Sequence[nn.Linear]) -> str:
    """PACKED or PLAIN: the faster bf16 weight layout over `linears` (one layer's) at decode-step
    row counts, raced here (kernels/timing.py)."""
    with torch.inference_mode():
        candidates = {p: [Bf16Linear(lin, p == PACKED) for lin in linears] for p in (PACKED, PLAIN)}
        total = dict.fromkeys(candidates, 0.0)
        for rows in _ROWS:
            times = timing.fastest([timing.over(m, rows, _call) for m in candidates.values()])
            for name, seconds in zip(candidates, times, strict=True):
                total[name] += seconds
    chosen = min(total, key=lambda k: total[k])
    log.info("bf16 linears: %s (%s)", chosen, ", ".join(f"{k} {1e3 * v:.2f} ms" for k, v in total.items()))
    return chosen


def decoder_linears(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    """Every nn.Linear of the model's decoder (not lm_head)."""
    prefix = str(getattr(model, "base_model_prefix", "model"))
    return [
        (name, m)
        for name, m in model.named_modules()
        if type(m) is nn.Linear and name.startswith(prefix + ".")
    ]


def converted(model: nn.Module) -> bool:
    """Whether the decoder's linears are Bf16Linear (lm_head's alone is an int8 engine's too)."""
    return any(isinstance(m, Bf16Linear) for name, m in model.named_modules() if name != "lm_head")


def convert(model: nn.Module) -> int:
    """Replace every decoder nn.Linear of `model` (on CPU) by a Bf16Linear; how many were replaced
    (0: none runs here, the model is unchanged)."""
    linears = decoder_linears(model)
    if not linears or not runs() or linears[0][1].weight.device.type != "cpu":
        return 0
    probe = [m for name, m in linears if ".layers.0." in name] or [m for _, m in linears[:7]]
    try:
        packed = choose(probe) == PACKED
    except RuntimeError as err:  # an op missing from this build
        log.warning("oneDNN's bf16 GEMM does not run here (%s)", err)
        return 0
    replace_linears(model, linears, lambda linear: Bf16Linear(linear, packed))
    return len(linears)


def convert_head(model: nn.Module) -> bool:
    """Replace `model`'s lm_head (an nn.Linear on CPU) by a Bf16Linear in the faster layout for it;
    whether it was replaced (idempotent: a converted head is no longer an nn.Linear)."""
    head = getattr(model, "lm_head", None)
    if type(head) is not nn.Linear or head.weight.device.type != "cpu" or not runs():
        return False
    try:
        packed = choose([head]) == PACKED
    except RuntimeError as err:  # an op missing from this build
        log.warning("oneDNN's bf16 GEMM does not run lm_head here (%s)", err)
        return False
    replace_linears(model, [("lm_head", head)], lambda linear: Bf16Linear(linear, packed))
    return True


def replace_linears(
    model: nn.Module, linears: Sequence[tuple[str, nn.Linear]], make: Callable[[nn.Linear], nn.Module]
) -> None:
    """Each (name, linear) of `model` replaced by make(linear)."""
    with torch.inference_mode():
        for name, linear in linears:
            parent_name, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, attr, make(linear))


def bf16_bytes(model: nn.Module) -> int:
    return sum(m.nbytes for m in model.modules() if isinstance(m, Bf16Linear))
