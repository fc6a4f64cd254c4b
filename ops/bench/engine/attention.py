"""The decode-attention kernel alone (csrc/paged_decode.cpp): ms for one decode step's attention,
one call per layer over that layer's own pool (SmolLM2-135M's shapes: 30 layers, 9 query heads,
3 KV heads, head_dim 64, blocks of 16 scattered over the pool), for each pool dtype at 1, 8 and 16
sequences of `--context` tokens. With `--against REV` the same calls also go to the kernel as it
was at git revision REV (its paged_decode.cpp and kv_rows.cpp built beside, as
torch.ops.kvferry_ref), the two alternated step by step (a shared machine drifts).

`python -m ops.bench.engine.attention [--against main] [--context 600] [--rounds 7]` prints the JSON:
`ms[dtype][count]` (the median step's CPU time, all threads: the machine is shared), `ref_ms`, and
`speedup_vs_ref` (ref_ms / ms)."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kvstore.pool import int8_rows
from workers.engine.kernels import build, paged_decode

LAYERS, HQ, HKV, D, BS = 30, 9, 3, 64, 16
COUNTS = (1, 8, 16)
CSRC = "workers/engine/kernels/csrc"


def _ref_op(rev: str) -> Callable[..., None]:
    """The kernel at `rev`, built under another namespace (-Dkvferry=kvferry_ref)."""
    from torch.utils.cpp_extension import load

    src = Path(tempfile.mkdtemp(prefix="kvferry_ref_"))
    names = subprocess.run(
        ["git", "ls-tree", "--name-only", f"{rev}:{CSRC}"], capture_output=True, text=True, check=True
    )
    for name in names.stdout.split():
        if name.endswith(".h") or name in ("paged_decode.cpp", "kv_rows.cpp"):
            show = subprocess.run(["git", "show", f"{rev}:{CSRC}/{name}"], capture_output=True, check=True)
            (src / name).write_bytes(show.stdout)
    load(
        name=f"kvferry_ref_{rev.replace('/', '_')}",
        sources=[str(src / "paged_decode.cpp"), str(src / "kv_rows.cpp")],
        extra_cflags=["-O3", "-march=native", "-fopenmp", "-Dkvferry=kvferry_ref"],
        extra_ldflags=["-fopenmp"],
        build_directory=str(src),
        is_python_module=False,
        verbose=False,
    )
    return torch.ops.kvferry_ref.paged_decode


def _case(dtype: torch.dtype, count: int, context: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(count)
    width = -(-context // BS)
    nblocks = count * width
    pools = []
    for _ in range(LAYERS):
        values = torch.randn(2, nblocks * BS, HKV, D, generator=gen)
        pools.append(int8_rows.quantize(values) if dtype == torch.int8 else values.to(dtype))
    return {
        "pools": pools,
        "blocks": torch.randperm(nblocks, generator=gen).view(count, width),
        "lens": torch.full((count,), context, dtype=torch.long),
        "query": torch.randn(count, HQ, D, generator=gen),
    }


def _step_ms(op: Callable[..., None], case: dict[str, Any]) -> float:
    out = torch.empty_like(case["query"])
    start = time.process_time()  # CPU time: on a loaded machine wall time is mostly waiting
    for pool in case["pools"]:
        op(out, case["query"], pool, case["blocks"], case["lens"], BS, D**-0.5)
    return (time.process_time() - start) * 1e3


def run(context: int, rounds: int, against: str | None) -> dict[str, Any]:
    assert build.built() and paged_decode.available(), "the CPU kernels did not build here"
    ops: dict[str, Callable[..., None]] = {"ms": torch.ops.kvferry.paged_decode}
    if against:
        ops["ref_ms"] = _ref_op(against)
    result: dict[str, Any] = {
        "context": context,
        "rounds": rounds,
        "threads": torch.get_num_threads(),
        "against": against,
    }
    for key in ops:
        result[key] = {}
    for dtype in paged_decode.POOL_DTYPES:
        name = str(dtype).removeprefix("torch.")
        times: dict[str, dict[int, list[float]]] = {key: {c: [] for c in COUNTS} for key in ops}
        for count in COUNTS:
            case = _case(dtype, count, context)
            for _ in range(rounds):
                for key, op in ops.items():
                    times[key][count].append(_step_ms(op, case))
        for key in ops:
            result[key][name] = {str(c): round(statistics.median(times[key][c]), 3) for c in COUNTS}
    if against:
        result["speedup_vs_ref"] = {
            dt: {c: round(result["ref_ms"][dt][c] / result["ms"][dt][c], 2) for c in result["ms"][dt]}
            for dt in result["ms"]
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--against", default=None, help="a git revision whose kernel to time alongside")
    args = parser.parse_args()
    print(json.dumps(run(args.context, args.rounds, args.against), indent=1))


if __name__ == "__main__":
    main()
