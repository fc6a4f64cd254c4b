"""`kvferry bench engine`: our engine and HF transformers side by side, in one run, on one model.

Parts: TTFT of a 1,024-token prompt with 1,008 tokens cached vs cold; decode throughput at 1, 8,
32 concurrent requests vs HF `generate` batched and vs sequential single requests; decode alone
(no prefill in it) at 16 concurrent, tok/s and TPOT, vs HF `generate` on equal-length prompts (its
best case: no left padding); peak pool
bytes for sessions that share a system prompt, with sharing vs without.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import replace
from functools import partial
from typing import Any

import torch

from broker.sampling import SamplingParams
from ops.bench.engine.decode import bench_decode, linear_baselines
from ops.bench.engine.hf_baseline import hf_generate, hf_model, prompt
from ops.bench.paired import alternate
from ops.settings import Settings, parse_size
from workers.engine.factory import build_engine, bytes_per_block
from workers.engine.llm_engine import LLMEngine
from workers.engine.model.loader import LoadedModel, load_model
from workers.engine.requests.request import GenerationRequest

# bench_decode's alternated baselines at 16 sequences: (row label, the baseline's TPOT key, ratio key)
_DECODE_BASELINE_ROWS = (
    (
        "decode TPOT at 16, fused decoder stack vs transformers' modules (ms)",
        "decode_modules_tpot_ms_16",
        "decode_fused_vs_modules_16",
    ),
    (
        "decode TPOT at 16, kvferry's GEMM vs oneDNN-packed linears (ms)",
        "decode_onednn_tpot_ms_16",
        "decode_gemm_vs_onednn_16",
    ),
    (
        "decode TPOT at 16, our linears vs F.linear (ms)",
        "decode_plain_linear_tpot_ms_16",
        "decode_packed_vs_plain_16",
    ),
    (
        "decode TPOT at 16, ours vs the modules over index_select + SDPA (ms)",
        "decode_gather_sdpa_tpot_ms_16",
        "decode_kernel_vs_gather_16",
    ),
)


def _ttft(engine: LLMEngine, prompt: list[int], rid: str) -> float:
    started = time.perf_counter()
    engine.add_request(GenerationRequest(rid, prompt, SamplingParams(max_tokens=1, ignore_eos=True)))
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id == rid and out.delta_token_ids:
                elapsed = time.perf_counter() - started
                while engine.has_unfinished():
                    engine.step()
                return elapsed
    raise RuntimeError("no token produced")


def bench_ttft(engine: LLMEngine, ref: Any, vocab: int, repeats: int) -> dict[str, Any]:
    rng = torch.Generator().manual_seed(1)
    cold, cached, hf = [], [], []
    for r in range(repeats):
        shared = prompt(rng, 1008, vocab)
        cold.append(_ttft(engine, shared + prompt(rng, 16, vocab), f"cold-{r}"))  # also warms the prefix
        cached.append(_ttft(engine, shared + prompt(rng, 16, vocab), f"cached-{r}"))
        hf.append(hf_generate(ref, [prompt(rng, 1024, vocab)], 1, 0))
    out = {
        "ttft_cold_s": statistics.median(cold),
        "ttft_cached_s": statistics.median(cached),
        "ttft_hf_generate_s": statistics.median(hf),
    }
    out["ttft_ratio"] = out["ttft_cached_s"] / out["ttft_cold_s"]
    return out


def bench_throughput(
    engine: LLMEngine, ref: Any, vocab: int, new_tokens: int, sequential: int, pairs: int = 3
) -> dict[str, Any]:
    """Tok/s of ours against HF, each ratio from `pairs` alternated pairs (ops/bench/paired.py)."""
    rng = torch.Generator().manual_seed(2)
    prompts = [prompt(rng, 32 + 4 * i, vocab) for i in range(32)]  # 32..156 tokens
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    ref.generation_config.eos_token_id = None  # same output lengths as ours

    def ours(n: int) -> float:
        engine.pool.reset_prefix_cache()  # decode speed, not prefix hits
        started = time.perf_counter()
        engine.generate(prompts[:n], params)
        return n * new_tokens / (time.perf_counter() - started)

    def hf_batched(n: int) -> float:
        return n * new_tokens / hf_generate(ref, prompts[:n], new_tokens, 0)

    def hf_sequential() -> float:
        started = time.perf_counter()
        for p in prompts[:sequential]:
            hf_generate(ref, [p], new_tokens, 0)
        return sequential * new_tokens / (time.perf_counter() - started)

    out: dict[str, Any] = {"new_tokens": new_tokens}
    for n in (1, 8, 32):
        batched = alternate(partial(ours, n), partial(hf_batched, n), pairs, warmup=n == 1)
        out[f"ours_tok_s_{n}"] = batched.ours_median
        out[f"hf_batched_tok_s_{n}"] = batched.baseline_median
        out[f"ratio_vs_hf_batched_{n}"] = batched.ratio
        out[f"ratio_vs_hf_batched_{n}_pairs"] = batched.table()
    one_by_one = alternate(partial(ours, 32), hf_sequential, pairs, warmup=False)
    out["hf_sequential_tok_s"] = one_by_one.baseline_median
    out["sequential_requests_measured"] = sequential
    out["throughput_ratio_vs_hf_batched_32"] = out["ratio_vs_hf_batched_32"]
    out["throughput_ratio_vs_sequential_32"] = one_by_one.ratio
    out["throughput_ratio_vs_sequential_32_pairs"] = one_by_one.table()
    return out


def _peak_pool_bytes(
    settings: Settings, loaded: LoadedModel, prompts: list[list[int]], sharing: bool
) -> dict[str, Any]:
    per_block = bytes_per_block(loaded, settings.block_size)
    blocks_unshared = len(prompts) * (max(len(p) for p in prompts) // settings.block_size + 2)
    config = replace(
        settings.engine_config(),
        cache_size_bytes=max(parse_size(settings.cache_size), blocks_unshared * per_block),
        max_num_seqs=len(prompts),
        max_num_batched_tokens=8192,
        enable_prefix_caching=sharing,
    )
    engine = build_engine(config, loaded)
    started = time.perf_counter()
    # 16 new tokens keep every session resident until the last one is admitted (the peak).
    outs = engine.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))
    wall = time.perf_counter() - started
    stats = engine.stats()
    del engine
    gc.collect()
    return {
        "peak_blocks": stats.pool.blocks_peak_used,
        "peak_bytes": stats.pool.blocks_peak_used * per_block,
        "prompt_tokens_computed": stats.prompt_tokens_computed,
        "cached_tokens": sum(o.cached_tokens for o in outs),
        "wall_s": wall,
    }


def bench_sharing(settings: Settings, loaded: LoadedModel, vocab: int, sessions: int) -> dict[str, Any]:
    rng = torch.Generator().manual_seed(3)
    system = prompt(rng, 1024, vocab)
    prompts = [system + prompt(rng, 32, vocab) for _ in range(sessions)]
    shared = _peak_pool_bytes(settings, loaded, prompts, sharing=True)
    unshared = _peak_pool_bytes(settings, loaded, prompts, sharing=False)
    return {
        "sessions": sessions,
        "shared": shared,
        "unshared": unshared,
        "pool_bytes_ratio_shared_vs_unshared": shared["peak_bytes"] / unshared["peak_bytes"],
    }


def _table(rows: list[tuple[str, str, str, str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def run_engine_bench(settings: Settings, quick: bool = False, skip: set[str] | None = None) -> dict[str, Any]:
    skip = skip or set()
    loaded = load_model(settings.model, settings.dtype, settings.device, settings.cache_dir)
    vocab = int(loaded.model.config.vocab_size)
    ref = hf_model(loaded)
    results: dict[str, Any] = {
        "model": loaded.model_id,
        "torch_threads": torch.get_num_threads(),
        "quick": quick,
    }
    rows = [("measure", "ours", "baseline", "ratio")]
    if "ttft" not in skip:
        engine = build_engine(settings.engine_config(), loaded)
        t = bench_ttft(engine, ref, vocab, repeats=1 if quick else 3)
        results.update(t)
        rows.append(
            (
                "TTFT 1,024 tok, 1,008 cached vs cold (s)",
                f"{t['ttft_cached_s']:.3f}",
                f"{t['ttft_cold_s']:.3f}",
                f"{t['ttft_ratio']:.3f}",
            )
        )
        rows.append(
            (
                "TTFT cold, ours vs HF generate (s)",
                f"{t['ttft_cold_s']:.3f}",
                f"{t['ttft_hf_generate_s']:.3f}",
                f"{t['ttft_cold_s'] / t['ttft_hf_generate_s']:.2f}",
            )
        )
        del engine
        gc.collect()
    if "throughput" not in skip:
        engine = build_engine(settings.engine_config(), loaded)
        pairs, new_tokens = (1, 16) if quick else (3, 64)
        t = bench_throughput(engine, ref, vocab, new_tokens, sequential=4 if quick else 32, pairs=pairs)
        results.update(t)
        baselines = linear_baselines(settings, loaded) if settings.packed_linear else {}
        d = bench_decode(engine, ref, vocab, 16, 128, new_tokens, baselines=baselines, pairs=pairs)
        del baselines
        results.update(d)
        for label, base, ratio in _DECODE_BASELINE_ROWS:
            if ratio in d:  # ours: the median of its own pairs with this baseline
                ours_ms = 1e3 * statistics.median(p["ours"] for p in d[f"{ratio}_pairs"]) / (new_tokens - 1)
                rows.append((label, f"{ours_ms:.1f}", f"{d[base]:.1f}", f"{d[ratio]:.2f}"))
        rows.append(
            (
                "decode-only tok/s at 16 (128-tok prompts) vs HF equal-length",
                f"{d['decode_only_tok_s_16']:.1f}",
                f"{d['hf_equal_len_decode_tok_s_16']:.1f}",
                f"{d['decode_ratio_vs_hf_equal_len_16']:.2f}",
            )
        )
        rows.append(
            (
                "decode TPOT at 16, ours vs HF equal-length (ms)",
                f"{d['decode_tpot_ms_16']:.1f}",
                f"{d['hf_equal_len_tpot_ms_16']:.1f}",
                f"{1 / d['decode_ratio_vs_hf_equal_len_16']:.2f}",  # the pairs' TPOT ratio
            )
        )
        for n in (1, 8, 32):
            rows.append(
                (
                    f"decode tok/s at {n} concurrent vs HF generate batched",
                    f"{t[f'ours_tok_s_{n}']:.1f}",
                    f"{t[f'hf_batched_tok_s_{n}']:.1f}",
                    f"{t[f'ratio_vs_hf_batched_{n}']:.2f}",
                )
            )
        rows.append(
            (
                "tok/s at 32 concurrent vs 32 sequential HF requests",
                f"{statistics.median(p['ours'] for p in t['throughput_ratio_vs_sequential_32_pairs']):.1f}",
                f"{t['hf_sequential_tok_s']:.1f}",
                f"{t['throughput_ratio_vs_sequential_32']:.2f}",
            )
        )
        del engine
        gc.collect()
    if "sharing" not in skip:
        s = bench_sharing(settings, loaded, vocab, sessions=20 if quick else 100)
        results["sharing"] = s
        results["pool_bytes_ratio_shared_vs_unshared"] = s["pool_bytes_ratio_shared_vs_unshared"]
        mib = 1024**2
        rows.append(
            (
                f"peak pool MiB, {s['sessions']} sessions x 1,024-tok system prompt",
                f"{s['shared']['peak_bytes'] / mib:.0f}",
                f"{s['unshared']['peak_bytes'] / mib:.0f}",
                f"{s['pool_bytes_ratio_shared_vs_unshared']:.3f}",
            )
        )
    if "precision" not in skip:  # decode_tpot_ms_16 per dtype, kv_bytes_per_token per KV dtype
        from ops.bench.engine.precision import precision_engines

        p = precision_engines(settings, rounds=1 if quick else 3)
        results["precision"] = p
        for mode, tpot in p["decode_tpot_ms_16"].items():
            rows.append(
                (
                    f"decode TPOT at 16, {mode} vs float32 (ms; KV {p['kv_bytes_per_token'][mode]} B/token)",
                    f"{tpot:.1f}",
                    f"{next(iter(p['decode_tpot_ms_16'].values())):.1f}",
                    f"{p['decode_tpot_ratio_vs_fp32_16'][mode]:.2f}",
                )
            )
    print(_table(rows), flush=True)
    return results
