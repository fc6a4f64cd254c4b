"""Decode throughput without prefill (part of `kvferry bench engine`), against HF `generate` at its
best case."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import torch

from broker.sampling import SamplingParams
from ops.bench.hf_baseline import hf_generate, prompt
from ops.settings import Settings
from workers.engine.kernels import packed_linear
from workers.engine.llm_engine import LLMEngine
from workers.engine.model.loader import LoadedModel, load_model


def _decode_only(engine: LLMEngine, prompts: list[list[int]], new_tokens: int) -> float:
    """Seconds of the steps after every request's first token: decode alone, no prefill in it."""
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"decode-{i}", p, params)
    while any(not s.output_token_ids for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    started = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    return time.perf_counter() - started


def _runner_set(
    engine: LLMEngine, changes: dict[str, Any], prompts: list[list[int]], new_tokens: int
) -> float:
    """_decode_only with the model runner's attributes set as `changes` says for the run (paths
    turned off)."""
    kept = {attr: getattr(engine.runner, attr) for attr in changes}
    for attr, value in changes.items():
        setattr(engine.runner, attr, value)
    try:
        return _decode_only(engine, prompts, new_tokens)
    finally:
        for attr, value in kept.items():
            setattr(engine.runner, attr, value)


def linear_baselines(settings: Settings, loaded: LoadedModel) -> dict[str, LLMEngine]:
    """Engines for bench_decode's baselines, each over its own copy of the model: F.linear, and
    oneDNN-packed weights where `loaded` runs kvferry's GEMM."""

    def copy() -> LoadedModel:
        return load_model(settings.model, settings.dtype, settings.device, settings.cache_dir)

    config = replace(settings.engine_config(), packed_linear=False)
    out = {"plain_linear": LLMEngine(config, copy())}
    if any(isinstance(m, packed_linear.SkinnyLinear) for m in loaded.model.modules()):
        onednn = copy()
        if packed_linear.pack_linears(onednn.model, (packed_linear.ONEDNN,)):
            out["onednn"] = LLMEngine(config, onednn)
    return out


def _alternated(
    baseline: Callable[[], float], ours: Callable[[], float], engines: tuple[LLMEngine, ...]
) -> tuple[float, float]:
    """Best seconds of each, timed alternately twice (the machine's drift hits both alike), each
    engine's prefix cache emptied between rounds."""
    runs = []
    for _ in range(2):
        runs.append((baseline(), ours()))
        for e in engines:
            e.pool.reset_prefix_cache()
    return min(b for b, _ in runs), min(o for _, o in runs)


def bench_decode(
    engine: LLMEngine,
    ref: Any,
    vocab: int,
    batch: int,
    prompt_len: int,
    new_tokens: int,
    baselines: dict[str, LLMEngine] | None = None,
) -> dict[str, Any]:
    """Decode throughput without prefill, ours vs HF generate at its best case: equal-length
    prompts (no left padding), its decode time being generate(new_tokens) - generate(1).
    `baselines`: the same engine over its own copy of the model with other linears, each timed
    alternately with ours, twice: "plain_linear" (`F.linear`, packed_linear off) and "onednn"
    (weights packed for oneDNN instead of kvferry's GEMM): what our GEMM buys. Where the engine
    reads decodes in place with the CPU kernel, it is also timed alternately with the kernel and
    the fused stack off (transformers' modules, index_select + SDPA), on the same engine: what both
    buy; where steps run the fused decoder stack, alternately with transformers' modules instead
    (same kernels): what fusing alone buys."""
    rng = torch.Generator().manual_seed(4)
    prompts = [prompt(rng, prompt_len, vocab) for _ in range(batch)]
    ref.generation_config.eos_token_id = None
    engine.pool.reset_prefix_cache()
    ours_s = _decode_only(engine, prompts, new_tokens)

    ours = partial(_decode_only, engine, prompts, new_tokens)
    base_s: dict[str, float] = {}
    for name, other in (baselines or {}).items():
        base_s[name], best = _alternated(
            partial(_decode_only, other, prompts, new_tokens), ours, (engine, other)
        )
        ours_s = min(ours_s, best)
    modules_s = None
    if engine.runner.fused is not None:
        modules = partial(_runner_set, engine, {"fused": None}, prompts, new_tokens)
        modules_s, best = _alternated(modules, ours, (engine,))
        ours_s = min(ours_s, best)
    gather_s = None
    if engine.runner.decode_kernel:
        gathered = partial(_runner_set, engine, {"decode_kernel": False, "fused": None}, prompts, new_tokens)
        gather_s, best = _alternated(gathered, ours, (engine,))
        ours_s = min(ours_s, best)
    hf_full = hf_generate(ref, prompts, new_tokens, 0)
    hf_decode_s = max(hf_full - hf_generate(ref, prompts, 1, 0), 1e-9)
    steps = new_tokens - 1
    out = {
        f"decode_only_tok_s_{batch}": batch * steps / ours_s,
        f"decode_tpot_ms_{batch}": 1e3 * ours_s / steps,
        f"hf_equal_len_decode_tok_s_{batch}": batch * steps / hf_decode_s,
        f"hf_equal_len_tpot_ms_{batch}": 1e3 * hf_decode_s / steps,
        f"hf_equal_len_tok_s_{batch}": batch * new_tokens / hf_full,
        "decode_prompt_len": prompt_len,
    }
    if "plain_linear" in base_s:
        out[f"decode_plain_linear_tpot_ms_{batch}"] = 1e3 * base_s["plain_linear"] / steps
        out[f"decode_packed_vs_plain_{batch}"] = ours_s / base_s["plain_linear"]
    if "onednn" in base_s:
        out[f"decode_onednn_tpot_ms_{batch}"] = 1e3 * base_s["onednn"] / steps
        out[f"decode_gemm_vs_onednn_{batch}"] = ours_s / base_s["onednn"]
    if modules_s is not None:
        out[f"decode_modules_tpot_ms_{batch}"] = 1e3 * modules_s / steps
        out[f"decode_fused_vs_modules_{batch}"] = ours_s / modules_s
    if gather_s is not None:
        out[f"decode_gather_sdpa_tpot_ms_{batch}"] = 1e3 * gather_s / steps
        out[f"decode_kernel_vs_gather_{batch}"] = ours_s / gather_s
    out[f"decode_ratio_vs_hf_equal_len_{batch}"] = (
        out[f"decode_only_tok_s_{batch}"] / out[f"hf_equal_len_decode_tok_s_{batch}"]
    )
    return out
