"""A bf16 CPU engine's decoder linears: bf16 weights on oneDNN's bf16 GEMM (AVX512-BF16 or AMX)
and on kvferry's (AVX512-BF16), fp32 in and out.

A decode step reads every weight of the model for a handful of rows, so halving the weights' bytes
is what pays; both GEMMs accumulate in fp32. Three ways are raced at start-up at decode-step row
counts, over the model's first layers (`race`: enough of them that their weights come from
memory, as in a step): oneDNN over the weight reordered once into its blocked layout, oneDNN over
the plain [out, in] weight, and kvferry's GEMM over the plain weight (csrc/skinny_bf16.cpp), which
streams the weights at close to what the memory gives where oneDNN's blocking for large batches
does not (docs/benchmarks.md). Where kvferry's wins, its crossover against oneDNN (in the faster
of its layouts) is measured over every linear, as the fp32 one is (crossover.py), and larger
batches (prefill chunks) stay oneDNN's. Where that layout is oneDNN's own, each linear keeps a
plain copy beside it for kvferry's GEMM: the bf16 weights are held twice (the bytes of the fp32
weights), for oneDNN over a plain weight is slower on prefill chunks (docs/benchmarks.md).

The activations, norms, residuals and attention stay fp32 (the input is rounded to bf16 for the
product, the output rounded to bf16 and widened back). lm_head gets a bf16 copy of its own
(`convert_head`; the embeddings it may be tied to stay fp32 for the lookup): at a decode step it
reads more bytes than any decoder layer, so the logits come from a bf16 GEMM too, rounded to bf16
as the decoder linears' outputs are (as vLLM's and transformers' bf16 models give them), then
widened to fp32 for sampling and logprobs. Its GEMM and layout are raced over the head itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol, cast

import torch
from torch import nn

from workers.engine.kernels import crossover, packed_linear, timing

log = logging.getLogger(__name__)
PACKED = "packed"
PLAIN = "plain"
KVFERRY = "kvferry"  # kvferry's GEMM over the plain weight up to its crossover, oneDNN's above
_ROWS = (1, 16)  # decode-step row counts timed
_PROBE_BYTES = 64 << 20  # the layers timed hold at least this much bf16 weight: more than a core's cache


def skinny_runs() -> bool:
    """kvferry's bf16 GEMM is built here (its CPU kernels, with AVX512-BF16)."""
    from workers.engine.kernels import build

    return build.built() and bool(torch.ops.kvferry.skinny_bf16_runs())


def runs() -> bool:
    """oneDNN's reorder and linear ops are in this torch (the fp32 packed linears' check)."""
    return packed_linear._onednn_runs()


class Bf16Linear(nn.Module):
    """y = x W^T + b with W in bf16 (oneDNN's blocked layout when `packed`), x and y fp32: kvferry's
    GEMM over the plain weight up to `max_rows` rows, oneDNN's above. A packed linear keeps a plain
    copy for kvferry's GEMM only where `plain` asks (`plain_weight`; a plain one reads its own)."""

    def __init__(self, linear: nn.Linear, packed: bool, plain: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        dense = linear.weight.detach().to(torch.bfloat16).contiguous()
        self.weight = torch.ops.mkldnn._reorder_linear_weight(dense, None) if packed else dense
        self.plain_weight = dense if plain or not packed else None  # what kvferry's GEMM reads
        self.bias = None if linear.bias is None else linear.bias.detach().float().contiguous()
        self.packed = packed
        self.max_rows = 0  # set by convert once measured (the fused stack reads it too)
        copies = 2 if packed and plain else 1
        self.nbytes = copies * dense.numel() * 2 + (0 if self.bias is None else self.bias.numel() * 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] > self.max_rows:
            return self.large(x)
        return self.skinny(rows.float()).view(*x.shape[:-1], self.out_features).to(x.dtype)

    def skinny(self, rows: torch.Tensor) -> torch.Tensor:
        """kvferry's bf16 GEMM over [rows, in] fp32."""
        if self.plain_weight is None:
            raise ValueError("kvferry's bf16 GEMM reads the plain weight, and this linear keeps none")
        return torch.ops.kvferry.skinny_bf16_linear(rows.contiguous(), self.plain_weight, self.bias)

    def large(self, x: torch.Tensor) -> torch.Tensor:
        """oneDNN's bf16 GEMM: x rounded to bf16, the output widened back to x's dtype."""
        y = torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), self.weight, self.bias, "none", [], "")
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        layout = "oneDNN-packed" if self.packed else "plain"
        ours = f", kvferry GEMM up to {self.max_rows} rows" if self.max_rows else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, bf16 {layout}{ours}"


class _Linear(Protocol):
    in_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


def _call(module: _Linear, x: torch.Tensor) -> object:
    return module(x)


def _skinny(module: Bf16Linear, x: torch.Tensor) -> object:
    return module.skinny(x)


def race(linears: Sequence[nn.Linear], ours: bool = False) -> dict[str, float]:
    """Seconds over `linears` at decode-step row counts, raced here (kernels/timing.py), of oneDNN's
    GEMM over the weight in each layout (PACKED, PLAIN) and, where `ours` and it runs here, of
    kvferry's bf16 GEMM (KVFERRY)."""
    with torch.inference_mode():
        candidates = {p: [Bf16Linear(lin, p == PACKED) for lin in linears] for p in (PACKED, PLAIN)}
        apply: dict[str, Callable[[Bf16Linear, torch.Tensor], object]] = {PACKED: _call, PLAIN: _call}
        if ours and skinny_runs():
            candidates[KVFERRY], apply[KVFERRY] = candidates[PLAIN], _skinny
        total = dict.fromkeys(candidates, 0.0)
        for rows in _ROWS:
            times = timing.fastest([timing.over(m, rows, apply[name]) for name, m in candidates.items()])
            for name, seconds in zip(candidates, times, strict=True):
                total[name] += seconds
    log.info("bf16 linears: %s", ", ".join(f"{k} {1e3 * v:.2f} ms" for k, v in total.items()))
    return total


def choose(linears: Sequence[nn.Linear]) -> str:
    """PACKED or PLAIN: the faster layout of oneDNN's bf16 GEMM over `linears` (race)."""
    total = race(linears)
    return PACKED if total[PACKED] <= total[PLAIN] else PLAIN


def _plan(linears: Sequence[nn.Linear]) -> tuple[bool, bool]:
    """(packed, ours): oneDNN's faster layout over `linears`, and whether kvferry's GEMM beat it
    (then a packed linear keeps a plain copy for it as well)."""
    total = race(linears, ours=True)
    packed = total[PACKED] <= total[PLAIN]
    return packed, KVFERRY in total and total[KVFERRY] < total[PACKED if packed else PLAIN]


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


def probe(linears: Sequence[nn.Linear]) -> list[nn.Linear]:
    """The first of `linears` (in the model's order: its first layers) holding _PROBE_BYTES of bf16
    weight, or all of them: timed, their weights come from memory, as in a step."""
    taken: list[nn.Linear] = []
    for linear in linears:
        taken.append(linear)
        if sum(m.weight.numel() * 2 for m in taken) >= _PROBE_BYTES:
            break
    return taken


def convert(model: nn.Module) -> int:
    """Replace every decoder nn.Linear of `model` (on CPU) by a Bf16Linear; how many were replaced
    (0: none runs here, the model is unchanged)."""
    linears = decoder_linears(model)
    if not linears or not runs() or linears[0][1].weight.device.type != "cpu":
        return 0
    try:
        packed, ours = _plan(probe([m for _, m in linears]))
        ours = ours and skinny_runs()
    except RuntimeError as err:  # an op missing from this build
        log.warning("oneDNN's bf16 GEMM does not run here (%s)", err)
        return 0
    replace_linears(model, linears, lambda linear: Bf16Linear(linear, packed, plain=ours))
    if ours:
        _measure_crossover([cast(Bf16Linear, model.get_submodule(name)) for name, _ in linears])
    return len(linears)


def _measure_crossover(modules: Sequence[Bf16Linear]) -> None:
    """Each of `modules` runs kvferry's GEMM up to the row count where it stops beating oneDNN's
    (in the layout it keeps) over them all (crossover.py)."""
    max_rows = crossover.measure(modules)
    log.info("kvferry's bf16 GEMM takes up to %d rows a step here (oneDNN above)", max_rows)
    for module in modules:
        module.max_rows = max_rows


def convert_head(model: nn.Module) -> bool:
    """Replace `model`'s lm_head (an nn.Linear on CPU) by a Bf16Linear in the faster layout for it;
    whether it was replaced (idempotent: a converted head is no longer an nn.Linear)."""
    head = getattr(model, "lm_head", None)
    if type(head) is not nn.Linear or head.weight.device.type != "cpu" or not runs():
        return False
    try:
        packed, ours = _plan([head])
        ours = ours and skinny_runs()
    except RuntimeError as err:  # an op missing from this build
        log.warning("oneDNN's bf16 GEMM does not run lm_head here (%s)", err)
        return False
    replace_linears(model, [("lm_head", head)], lambda linear: Bf16Linear(linear, packed, plain=ours))
    if ours:
        _measure_crossover([cast(Bf16Linear, model.lm_head)])
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
