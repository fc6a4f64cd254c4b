"""Decode TPOT at 16 sequences and KV bytes per token for each precision (`kvferry bench engine`'s
`precision` part, and `kvferry bench quality`'s speed columns)."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any

from ops.bench.engine.decode import _decode_only
from ops.settings import Settings
from workers.engine.factory import build_engine
from workers.engine.llm_engine import LLMEngine
from workers.engine.model.loader import load_model

MODES = (("float32", "float32"), ("bfloat16", "float32"), ("bfloat16", "bfloat16"))  # (dtype, kv_cache_dtype)


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
    """decode_tpot_16 over one engine of each of MODES, each on its own copy of the weights."""
    engines = {
        mode_name(dtype, kv): build_engine(
            replace(settings.engine_config(), dtype=dtype, kv_cache_dtype=kv),
            load_model(settings.model, "float32", settings.device, settings.cache_dir),
        )
        for dtype, kv in MODES
    }
    return decode_tpot_16(engines, rounds)
