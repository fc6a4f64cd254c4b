"""`kvferry bench quality`: what each precision costs in quality and buys in speed and memory, on
one model, in one run (issue 41).

For each mode (dtype, kv_cache_dtype, quantization): the perplexity of a fixed held-out text
(heldout.txt) from the engine's prompt logprobs, as a ratio to HF transformers' fp32 forward over
the same tokens (`ppl_ratio_vs_hf_fp32`); greedy agreement with HF `generate` in fp32 and in the mode's dtype
(`greedy_agree_tokens*`: tokens until the first difference, averaged over chat prompts); decode
TPOT at 16 concurrent sequences (`decode_tpot_ms_16`, the modes' runs alternated, best of the
rounds, with its ratio to fp32 measured in the same run); and `kv_bytes_per_token`.
"""

from __future__ import annotations

import gc
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from broker.sampling import SamplingParams
from ops.bench.engine.hf_baseline import hf_greedy, hf_model
from ops.bench.engine.precision import MODES, decode_tpot_16, mode_name
from ops.settings import Settings
from workers.engine.factory import build_engine
from workers.engine.llm_engine import LLMEngine
from workers.engine.model.loader import load_model
from workers.engine.requests.request import GenerationRequest

_QUESTIONS = (
    "Explain in two sentences why the sky is blue.",
    "Write a short poem about a lighthouse.",
    "What are three uses of a paperclip?",
    "Give me a recipe for pancakes.",
    "Why do rivers meander across flat land?",
    "Describe the rules of chess briefly.",
)


def _hf_nll(ref: Any, ids: list[int]) -> float:
    with torch.inference_mode():
        logits = ref(torch.tensor([ids])).logits[0, :-1].float()
    return float(torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]), reduction="mean"))


def _engine_nll(engine: LLMEngine, ids: list[int]) -> float:
    engine.add_request(
        GenerationRequest("ppl", ids, SamplingParams(max_tokens=1, prompt_logprobs=0, ignore_eos=True))
    )
    out = None
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished:
                out = o
    assert out is not None
    lps = [lp.logprob for lp in out.prompt_logprobs if lp.logprob is not None]  # tokens 1.. (0: none)
    return -sum(lps) / len(lps)


def _greedy(engine: LLMEngine, prompts: list[list[int]], n: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(GenerationRequest(f"g{i}", p, params))
    outs: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished:
                outs[o.request_id] = list(o.token_ids)
    return [outs[f"g{i}"] for i in range(len(prompts))]


def _agree(a: list[list[int]], b: list[list[int]]) -> float:
    def prefix(x: list[int], y: list[int]) -> int:
        return next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))

    return sum(prefix(x, y) for x, y in zip(a, b, strict=True)) / len(a)


def run_quality_bench(settings: Settings, quick: bool = False) -> dict[str, Any]:
    base = load_model(settings.model, "float32", settings.device, settings.cache_dir)
    tok = base.tokenizer
    text = (Path(__file__).with_name("heldout.txt")).read_text()
    ids = tok(text)["input_ids"][: 256 if quick else 1024]
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for q in _QUESTIONS[: 3 if quick else 6]
    ]
    new = 24 if quick else 64
    ref = hf_model(base)
    hf_nll = _hf_nll(ref, ids)
    hf_tokens = {"float32": [hf_greedy(ref, p, new) for p in prompts]}
    ref_bf16 = hf_model(base).to(torch.bfloat16)
    hf_tokens["bfloat16"] = [hf_greedy(ref_bf16, p, new) for p in prompts]
    del ref, ref_bf16
    gc.collect()
    results: dict[str, Any] = {
        "model": base.model_id,
        "heldout_tokens": len(ids),
        "hf_fp32_ppl": math.exp(hf_nll),
        "torch_threads": torch.get_num_threads(),
        "quick": quick,
        "modes": {},
    }
    engines: dict[str, LLMEngine] = {}
    for dtype, kv, quantization in MODES:
        config = replace(settings.engine_config(), dtype=dtype, kv_cache_dtype=kv, quantization=quantization)
        loaded = (
            base if dtype == "float32" else load_model(settings.model, "float32", "cpu", settings.cache_dir)
        )
        engine = engines[mode_name(dtype, kv, quantization)] = build_engine(config, loaded)
        nll = _engine_nll(engine, ids)
        got = _greedy(engine, prompts, new)
        results["modes"][mode_name(dtype, kv, quantization)] = {
            "dtype": engine.served.precision.weights,
            "quantization": engine.served.precision.quantization,
            "kv_cache_dtype": engine.served.precision.kv,
            "ppl": math.exp(nll),
            "ppl_ratio_vs_hf_fp32": math.exp(nll - hf_nll),
            "greedy_agree_tokens": _agree(got, hf_tokens["float32"]),
            "greedy_agree_tokens_vs_hf_same_dtype": _agree(got, hf_tokens[engine.served.precision.weights]),
            "greedy_tokens": new,
            "kv_bytes_per_token": engine.served.layout.bytes_per_token,
            "weights_bytes": engine.served.weights_bytes,
        }
    results.update(decode_tpot_16(engines, rounds=1 if quick else 3))
    return results


def report(results: dict[str, Any]) -> str:
    lines = [f"held-out text: {results['heldout_tokens']} tokens, HF fp32 ppl {results['hf_fp32_ppl']:.3f}"]
    lines.append(
        "mode                     ppl/HF-fp32  agree(fp32)  agree(same)  TPOT@16 ms  vs fp32  KV B/tok"
    )
    for name, m in results["modes"].items():
        tpot, ratio = results["decode_tpot_ms_16"][name], results["decode_tpot_ratio_vs_fp32_16"][name]
        lines.append(
            f"{name:<24} {m['ppl_ratio_vs_hf_fp32']:>11.4f}  {m['greedy_agree_tokens']:>11.1f}  "
            f"{m['greedy_agree_tokens_vs_hf_same_dtype']:>11.1f}  {tpot:>10.1f}  {ratio:>7.2f}  "
            f"{m['kv_bytes_per_token']:>8}"
        )
    return "\n".join(lines)
