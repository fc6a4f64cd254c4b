"""Decode TPOT at 1, 8 and 16 sequences and KV bytes per token for each precision (`kvferry bench
engine`'s `precision` part, and `kvferry bench quality`'s speed columns).

`precision_engines` builds one engine per mode in this process, their runs alternated round by
round. `python -m ops.bench.engine.precision [--rounds R] [--context N]` runs each mode in a process
of its own instead (one engine per process: no mode's oneDNN kernels, caches or threads beside
another's), alternating the processes round by round, and prints the JSON (ratios to fp32 in it)."""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
from dataclasses import replace
from typing import Any

from ops.bench.engine.decode import _decode_only
from ops.settings import Settings
from workers.engine.factory import build_engine
from workers.engine.llm_engine import LLMEngine
from workers.engine.model.loader import load_model

# (dtype, kv_cache_dtype, quantization)
MODES = (
    ("float32", "float32", "none"),
    ("bfloat16", "float32", "none"),
    ("bfloat16", "bfloat16", "none"),
    ("bfloat16", "bfloat16", "int8"),
    ("bfloat16", "int8", "none"),  # int8 K/V (opt-in)
    ("float32", "int8", "none"),
)
COUNTS = (1, 8, 16)  # concurrent sequences timed


def mode_name(dtype: str, kv: str, quantization: str = "none") -> str:
    weights = dtype if quantization == "none" else quantization
    return f"{weights}/kv-{kv}"


def _prompts(count: int, context: int) -> list[list[int]]:
    rng = random.Random(count)
    return [[rng.randrange(100, 40000) for _ in range(context)] for _ in range(count)]


def decode_tpot(
    engines: dict[str, LLMEngine],
    rounds: int,
    counts: tuple[int, ...] = COUNTS,
    context: int = 128,
    new_tokens: int = 33,
) -> dict[str, Any]:
    """Decode-only TPOT at each of `counts` sequences of `context`-token prompts for each engine,
    the engines' runs alternated round by round (a shared machine drifts), best round each; ratios
    to the first engine. `decode_tpot_ms_16` is the 16-sequence column."""
    best = {c: dict.fromkeys(engines, math.inf) for c in counts}
    for _ in range(rounds):
        for count in counts:
            prompts = _prompts(count, context)
            for name, engine in engines.items():
                engine.pool.reset_prefix_cache()
                tpot = _decode_only(engine, prompts, new_tokens) / (new_tokens - 1)
                best[count][name] = min(best[count][name], tpot)
    first = next(iter(engines))
    out: dict[str, Any] = {
        "context_tokens": context,
        "decode_tpot_ms": {str(c): {k: 1e3 * v for k, v in b.items()} for c, b in best.items()},
        "decode_tpot_ratio_vs_fp32": {
            str(c): {k: v / b[first] for k, v in b.items()} for c, b in best.items()
        },
        "kv_bytes_per_token": {k: e.served.layout.bytes_per_token for k, e in engines.items()},
    }
    if 16 in best:
        out["decode_tpot_ms_16"] = out["decode_tpot_ms"]["16"]
        out["decode_tpot_ratio_vs_fp32_16"] = out["decode_tpot_ratio_vs_fp32"]["16"]
    return out


def decode_tpot_16(engines: dict[str, LLMEngine], rounds: int) -> dict[str, Any]:
    return decode_tpot(engines, rounds, (16,))


def mode_engine(settings: Settings, dtype: str, kv: str, quantization: str) -> LLMEngine:
    """An engine of one mode over its own copy of the weights."""
    config = replace(settings.engine_config(), dtype=dtype, kv_cache_dtype=kv, quantization=quantization)
    return build_engine(config, load_model(settings.model, "float32", settings.device, settings.cache_dir))


def precision_engines(settings: Settings, rounds: int) -> dict[str, Any]:
    """decode_tpot over one engine of each of MODES, in this process."""
    engines = {mode_name(*m): mode_engine(settings, *m) for m in MODES}
    return decode_tpot(engines, rounds)


def _one(mode: str, context: int) -> None:
    """A child: one round of decode_tpot for one mode, its JSON on stdout's last line."""
    settings = Settings.from_env()
    (chosen,) = [m for m in MODES if mode_name(*m) == mode]
    result = decode_tpot({mode: mode_engine(settings, *chosen)}, 1, COUNTS, context)
    print(json.dumps(result))


def per_process(rounds: int, context: int) -> dict[str, Any]:
    """decode_tpot with each mode in a process of its own, the processes alternated round by round."""
    best: dict[str, dict[str, float]] = {str(c): {} for c in COUNTS}
    kv: dict[str, int] = {}
    for _ in range(rounds):
        for m in MODES:
            name = mode_name(*m)
            cmd = [
                sys.executable,
                "-m",
                "ops.bench.engine.precision",
                "--one",
                name,
                "--context",
                str(context),
            ]
            got = json.loads(
                subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1]
            )
            kv[name] = got["kv_bytes_per_token"][name]
            for c, by_mode in got["decode_tpot_ms"].items():
                best[c][name] = min(best[c].get(name, math.inf), by_mode[name])
    first = mode_name(*MODES[0])
    ratios = {c: {k: v / b[first] for k, v in b.items()} for c, b in best.items()}
    return {
        "context_tokens": context,
        "decode_tpot_ms": best,
        "decode_tpot_ratio_vs_fp32": ratios,
        "kv_bytes_per_token": kv,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--one", help="a child: the mode to time")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--context", type=int, default=600, help="prompt tokens of each sequence")
    args = parser.parse_args()
    if args.one:
        _one(args.one, args.context)
    else:
        print(json.dumps(per_process(args.rounds, args.context), indent=1))
