"""Decode throughput without prefill (part of `kvferry bench engine`), against HF `generate` at its
best case."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import torch

from broker.sampling import SamplingParams
from ops.bench.engine.hf_baseline import hf_generate, prompt
from ops.bench.paired import Pairs, alternate
from ops.settings import Settings
from workers.engine.factory import build_engine
from workers.engine.kernels import packed_linear
from workers.engine.llm_engine import LLMEngine
from workers.engine.model.loader import LoadedModel, load_model
from workers.engine.requests.request import GenerationRequest


def _decode_only(engine: LLMEngine, prompts: list[list[int]], new_tokens: int) -> float:
    """Seconds of the steps after every request's first token: decode alone, no prefill in it."""
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(GenerationRequest(f"decode-{i}", p, params))
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
    kept = {attr: getattr(engine.executor.runner, attr) for attr in changes}
    for attr, value in changes.items():
        setattr(engine.executor.runner, attr, value)
    try:
        return _decode_only(engine, prompts, new_tokens)
    finally:
        for attr, value in kept.items():
            setattr(engine.executor.runner, attr, value)


def linear_baselines(settings: Settings, loaded: LoadedModel) -> dict[str, LLMEngine]:
    """Engines for bench_decode's baselines, each over its own copy of the model: F.linear, and
    oneDNN-packed weights where `loaded` runs kvferry's GEMM."""

    def copy() -> LoadedModel:
        return load_model(settings.model, settings.dtype, settings.device, settings.cache_dir)

    config = replace(settings.engine_config(), packed_linear=False)
    out = {"plain_linear": build_engine(config, copy())}
    if any(isinstance(m, packed_linear.SkinnyLinear) for m in loaded.model.modules()):
        onednn = copy()
        if packed_linear.pack_linears(onednn.model, (packed_linear.ONEDNN,)):
            out["onednn"] = build_engine(config, onednn)
    return out


# bench_decode's baselines: (its TPOT key, the ratio's key), each key then ends in the batch size
_BASELINE_KEYS = {
    "plain_linear": ("decode_plain_linear_tpot_ms", "decode_packed_vs_plain"),
    "onednn": ("decode_onednn_tpot_ms", "decode_gemm_vs_onednn"),
    "modules": ("decode_modules_tpot_ms", "decode_fused_vs_modules"),
    "gather_sdpa": ("decode_gather_sdpa_tpot_ms", "decode_kernel_vs_gather"),
}


def _resetting(*engines: LLMEngine) -> Callable[[], None]:
    """Empties each engine's prefix cache: every run prefills its prompts alike."""

    def reset() -> None:
        for e in engines:
            e.pool.reset_prefix_cache()

    return reset


def _hf_decode_s(ref: Any, prompts: list[list[int]], new_tokens: int, full_s: list[float]) -> float:
    """HF generate's decode seconds at its best case: generate(new_tokens) - generate(1); the
    full call's seconds go to `full_s`."""
    full = hf_generate(ref, prompts, new_tokens, 0)
    full_s.append(full)
    return max(full - hf_generate(ref, prompts, 1, 0), 1e-9)


def decode_figures(batch: int, new_tokens: int, compared: dict[str, Pairs], hf: Pairs) -> dict[str, Any]:
    """bench_decode's keys from its pairs (seconds on both sides): each `*_vs_*` ratio is the median
    of its pairs' ratios, each listed under `<ratio key>_pairs`; our own figures are those of the
    pairs with HF."""
    steps = new_tokens - 1
    ours_s = hf.ours_median
    out: dict[str, Any] = {
        f"decode_only_tok_s_{batch}": batch * steps / ours_s,
        f"decode_tpot_ms_{batch}": 1e3 * ours_s / steps,
        f"hf_equal_len_decode_tok_s_{batch}": batch * steps / hf.baseline_median,
        f"hf_equal_len_tpot_ms_{batch}": 1e3 * hf.baseline_median / steps,
    }
    for name, pairs in compared.items():
        tpot, ratio = _BASELINE_KEYS[name]
        out[f"{tpot}_{batch}"] = 1e3 * pairs.baseline_median / steps
        out[f"{ratio}_{batch}"] = pairs.ratio
        out[f"{ratio}_{batch}_pairs"] = pairs.table()
    # tok/s, ours over HF's, pair by pair
    rates = Pairs.of([batch * steps / s for s in hf.ours], [batch * steps / s for s in hf.baseline])
    out[f"decode_ratio_vs_hf_equal_len_{batch}"] = rates.ratio
    out[f"decode_ratio_vs_hf_equal_len_{batch}_pairs"] = rates.table()
    return out


def bench_decode(
    engine: LLMEngine,
    ref: Any,
    vocab: int,
    batch: int,
    prompt_len: int,
    new_tokens: int,
    baselines: dict[str, LLMEngine] | None = None,
    pairs: int = 3,
) -> dict[str, Any]:
    """Decode throughput without prefill, ours vs HF generate at its best case: equal-length
    prompts (no left padding), its decode time being generate(new_tokens) - generate(1).
    `baselines`: the same engine over its own copy of the model with other linears: "plain_linear"
    (`F.linear`, packed_linear off) and "onednn" (weights packed for oneDNN instead of kvferry's
    GEMM): what our GEMM buys. Where the engine reads decodes in place with the CPU kernel, it is
    also compared with the kernel and the fused stack off (transformers' modules, index_select +
    SDPA), on the same engine: what both buy; where steps run the fused decoder stack, with
    transformers' modules instead (same kernels): what fusing alone buys. Each comparison is
    `pairs` alternated pairs, ours then the other (ops/bench/paired.py)."""
    rng = torch.Generator().manual_seed(4)
    prompts = [prompt(rng, prompt_len, vocab) for _ in range(batch)]
    ref.generation_config.eos_token_id = None
    ours = partial(_decode_only, engine, prompts, new_tokens)
    compared: dict[str, Pairs] = {}
    for name, other in (baselines or {}).items():
        theirs = partial(_decode_only, other, prompts, new_tokens)
        compared[name] = alternate(ours, theirs, pairs, _resetting(engine, other))
    if engine.executor.runner.fused is not None:
        modules = partial(_runner_set, engine, {"fused": None}, prompts, new_tokens)
        compared["modules"] = alternate(ours, modules, pairs, _resetting(engine))
    if engine.executor.runner.decode_kernel:
        gathered = partial(_runner_set, engine, {"decode_kernel": False, "fused": None}, prompts, new_tokens)
        compared["gather_sdpa"] = alternate(ours, gathered, pairs, _resetting(engine))
    hf_full: list[float] = []
    hf = alternate(ours, partial(_hf_decode_s, ref, prompts, new_tokens, hf_full), pairs, _resetting(engine))
    out = decode_figures(batch, new_tokens, compared, hf)
    timed_full = hf_full[-pairs:]  # the first was the warm-up's
    out[f"hf_equal_len_tok_s_{batch}"] = batch * new_tokens / statistics.median(timed_full)
    out["decode_prompt_len"] = prompt_len
    return out
