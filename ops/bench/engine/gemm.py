"""The model's linear shapes on each CPU GEMM (`kvferry bench gemm`): kvferry's decode-step GEMM
vs oneDNN over packed weights vs `F.linear`, at the row counts a step gives (a few decodes to a
prefill chunk), each timed alternately in one run. GFLOPS, the weight read rate, and ratios to
oneDNN (below 1: kvferry's GEMM is faster). In fp32, or in bf16 (`--dtype bfloat16`, or `auto`
where it resolves to bf16): bf16 weights, kvferry's bf16 GEMM (csrc/skinny_bf16.cpp) against
oneDNN's bf16 GEMM over its packed layout and over the plain weight (`onednn_plain`: the one copy
a bf16 engine on kvferry's GEMM keeps), `F.linear` over bf16 operands.

As in a decode step, every weight comes from memory, not from cache: each shape is timed over
enough distinct copies of its weight to pass the CPU's last-level cache (a step reads all of the
model's weights once; SmolLM2-135M's are 540 MB)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ops.bench.paired import Pairs
from ops.settings import Settings
from workers.engine.kernels import bf16_linear, build
from workers.engine.model.loader import load_model
from workers.engine.model.precision import Precision

ROWS = (1, 8, 16, 32, 128, 512)
QUICK_ROWS = (1, 16, 128)
ROUNDS = 3  # alternated rounds per shape and row count: an odd count of kvferry/oneDNN pairs
_STREAM_BYTES = 256 << 20  # per shape: well past a server CPU's last-level cache


def _shapes(config: Any) -> dict[str, tuple[int, int]]:
    """[out, in] of each distinct linear of a Llama-family decoder layer, and lm_head."""
    hidden = config.hidden_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    kv = config.num_key_value_heads * head_dim
    return {
        "q/o_proj": (config.num_attention_heads * head_dim, hidden),
        "k/v_proj": (kv, hidden),
        "gate/up_proj": (config.intermediate_size, hidden),
        "down_proj": (hidden, config.intermediate_size),
        "lm_head": (config.vocab_size, hidden),
    }


def _seconds(fn: Callable[[], object], budget_s: float) -> float:
    """Median seconds of one call, over as many calls as fit in `budget_s` (at least 3)."""
    fn()
    times: list[float] = []
    spent = 0.0
    while len(times) < 3 or spent < budget_s:
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
        spent += times[-1]
    return statistics.median(times)


def _pointwise(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
    return out


def _calls(
    x: torch.Tensor, weights: list[torch.Tensor], packed: list[torch.Tensor], kvferry: bool
) -> dict[str, Callable[[], object]]:
    """One call: x (fp32) times every copy of the weight, in turn. Over bf16 weights each call
    takes x in fp32 and gives fp32, as in a step: oneDNN and F.linear round x to bf16 and widen
    their output (Bf16Linear.large), kvferry's GEMM does both inside."""
    bf16 = weights[0].dtype == torch.bfloat16

    def apply(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], w: torch.Tensor) -> None:
        fn(x.to(torch.bfloat16), w).float() if bf16 else fn(x, w)

    def onednn() -> None:
        for p in packed:
            apply(_pointwise, p)

    def onednn_plain() -> None:
        for w in weights:
            apply(_pointwise, w)

    def f_linear() -> None:
        for w in weights:
            apply(F.linear, w)

    def ours() -> None:  # the op looked up when run: the kernels are loaded by then
        skinny = torch.ops.kvferry.skinny_bf16_linear if bf16 else torch.ops.kvferry.skinny_linear
        for w in weights:
            skinny(x, w, None)

    calls: dict[str, Callable[[], object]] = {"kvferry": ours} if kvferry else {}
    calls |= {"onednn": onednn}  # kvferry's pairs: it, then oneDNN
    return calls | ({"onednn_plain": onednn_plain} if bf16 else {}) | {"f_linear": f_linear}


def run_gemm_bench(settings: Settings, quick: bool = False) -> dict[str, Any]:
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    config = load_model(settings.model, "float32", "cpu", settings.cache_dir).model.config
    dtype = torch.float32
    if Precision.resolve(settings.dtype, "auto", "cpu").weights == "bfloat16":
        dtype = torch.bfloat16
    have_kvferry = build.built() and (dtype == torch.float32 or bf16_linear.skinny_runs())
    gen = torch.Generator().manual_seed(0)
    budget = 0.3 if quick else 1.0
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for name, (out_f, in_f) in _shapes(config).items():
        size = torch.finfo(dtype).bits // 8
        copies = max(2, -(-_STREAM_BYTES // (out_f * in_f * size)))
        weights = [torch.randn(out_f, in_f, generator=gen).to(dtype) for _ in range(copies)]
        packed = [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in weights]
        table[name] = {}
        for rows in QUICK_ROWS if quick else ROWS:
            calls = _calls(torch.randn(rows, in_f, generator=gen), weights, packed, have_kvferry)
            with torch.inference_mode():
                secs: dict[str, list[float]] = {impl: [] for impl in calls}
                for _ in range(ROUNDS):  # alternated: the machine's drift hits each alike
                    for impl, fn in calls.items():
                        secs[impl].append(_seconds(fn, budget))
            flops = 2.0 * rows * out_f * in_f * copies
            entry: dict[str, Any] = {}
            for impl, s in secs.items():
                best = min(s)
                entry[f"{impl}_gflops"] = flops / best / 1e9
                entry[f"{impl}_weight_gb_s"] = out_f * in_f * size * copies / best / 1e9
            if have_kvferry:
                pairs = Pairs.of(secs["kvferry"], secs["onednn"])  # timed one right after the other
                entry["kvferry_vs_onednn"] = pairs.ratio
                entry["kvferry_vs_onednn_pairs"] = pairs.table()
            table[name][str(rows)] = entry
    out: dict[str, Any] = {"gemm": table, "threads": torch.get_num_threads(), "dtype": str(dtype)[6:]}
    if have_kvferry:
        ratios = [table[name]["16"]["kvferry_vs_onednn"] for name in table]
        out["gemm_vs_onednn_16"] = statistics.geometric_mean(ratios)
    return out


def _cell(entry: dict[str, Any], impl: str) -> str:
    return f"{entry[f'{impl}_gflops']:12.1f}" if f"{impl}_gflops" in entry else f"{'-':>12s}"


def report(results: dict[str, Any]) -> str:
    impls = ("kvferry", "onednn", "onednn_plain", "f_linear")
    head = f"{'shape':14s} {'rows':>5s} " + " ".join(f"{i:>12s}" for i in impls) + f" {'ratio':>6s}"
    lines = [f"{head}  ({results.get('dtype', 'float32')} GFLOPS, weights from memory)"]
    for name, by_rows in results["gemm"].items():
        for rows, e in by_rows.items():
            cells = " ".join(_cell(e, impl) for impl in impls)
            ratio = f"{e['kvferry_vs_onednn']:6.2f}" if "kvferry_vs_onednn" in e else f"{'-':>6s}"
            lines.append(f"{name:14s} {rows:>5s} {cells} {ratio}")
    if "gemm_vs_onednn_16" in results:
        lines.append(
            f"time at 16 rows, kvferry / oneDNN (geometric mean): {results['gemm_vs_onednn_16']:.2f}"
        )
    return "\n".join(lines)
