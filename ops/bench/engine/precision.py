"""Decode TPOT at 16 sequences and KV bytes per token for each precision (`kvferry bench engine`'s
`precision` part, and `kvferry bench quality`'s speed columns).

`kvferry bench engine` runs each mode's engine in a process of its own (`python -m
ops.bench.engine.precision`, its config as JSON on stdin, its figures as JSON on stdout): engines
sharing a process share its allocator, caches and oneDNN's primitive cache, which moves TPOT by
more than the modes differ. The modes' processes alternate round by round; best round each."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import subprocess
import sys
from dataclasses import replace
from typing import Any

from ops.bench.engine.decode import _decode_only
from ops.settings import Settings
from workers.engine.config import EngineConfig
from workers.engine.factory import build_engine
from workers.engine.llm_engine import LLMEngine
from workers.engine.model.loader import load_model

MODES = (  # (dtype, kv_cache_dtype); int8 K/V is opt-in, measured here beside the others
    ("float32", "float32"),
    ("bfloat16", "float32"),
    ("bfloat16", "bfloat16"),
    ("bfloat16", "int8"),
    ("float32", "int8"),
)


def mode_name(dtype: str, kv: str) -> str:
    return f"{dtype}/kv-{kv}"


def decode_tpot_16(engines: dict[str, LLMEngine], rounds: int, new_tokens: int = 33) -> dict[str, Any]:
    """Decode-only TPOT at 16 sequences of 128-token prompts for each engine, the engines' runs
    alternated round by round (a shared machine drifts), best round each; ratios to the first."""
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 40000) for _ in range(128)] for _ in range(16)]
    best = dict.fromkeys(engines, math.inf)
    for _ in range(rounds):
        for name, engine in engines.items():
            engine.pool.reset_prefix_cache()
            best[name] = min(best[name], _decode_only(engine, prompts, new_tokens) / (new_tokens - 1))
    first = next(iter(best))
    return {
        "decode_tpot_ms_16": {k: 1e3 * v for k, v in best.items()},
        "decode_tpot_ratio_vs_fp32_16": {k: v / best[first] for k, v in best.items()},
        "kv_bytes_per_token": {k: e.served.layout.bytes_per_token for k, e in engines.items()},
    }


def precision_engines(settings: Settings, rounds: int) -> dict[str, Any]:
    """decode_tpot_16 for each of MODES, one engine per process, the modes alternated round by
    round; best round each, ratios to the first mode's."""
    best: dict[str, float] = {}
    kv_bytes: dict[str, int] = {}
    for _ in range(rounds):
        for dtype, kv in MODES:
            config = replace(settings.engine_config(), dtype=dtype, kv_cache_dtype=kv)
            job = {
                "engine": dataclasses.asdict(config),
                "model": settings.model,
                "device": settings.device,
                "cache_dir": str(settings.cache_dir),
            }
            done = subprocess.run(
                [sys.executable, "-m", "ops.bench.engine.precision"],
                input=json.dumps(job),
                capture_output=True,
                text=True,
                check=True,
            )
            got = json.loads(done.stdout.strip().splitlines()[-1])
            name = mode_name(dtype, kv)
            print(f"precision: {name}: decode TPOT at 16 {got['decode_tpot_ms_16']:.1f} ms", flush=True)
            best[name] = min(best.get(name, math.inf), got["decode_tpot_ms_16"])
            kv_bytes[name] = got["kv_bytes_per_token"]
    first = next(iter(best))
    return {
        "decode_tpot_ms_16": best,
        "decode_tpot_ratio_vs_fp32_16": {k: v / best[first] for k, v in best.items()},
        "kv_bytes_per_token": kv_bytes,
        "one_engine_per_process": True,
    }


def _one_mode(job: dict[str, Any]) -> dict[str, Any]:
    """One engine of the job's config: its TPOT at 16 (ms) and KV bytes per token."""
    from pathlib import Path

    loaded = load_model(job["model"], "float32", job["device"], Path(job["cache_dir"]))
    engine = build_engine(EngineConfig(**job["engine"]), loaded)
    measured = decode_tpot_16({"mode": engine}, rounds=1)
    return {
        "decode_tpot_ms_16": measured["decode_tpot_ms_16"]["mode"],
        "kv_bytes_per_token": measured["kv_bytes_per_token"]["mode"],
        "precision": engine.served.precision.describe(),
    }


if __name__ == "__main__":
    print(json.dumps(_one_mode(json.loads(sys.stdin.read()))), flush=True)
