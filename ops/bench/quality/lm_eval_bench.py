"""`kvferry bench lm-eval`: lm-eval's multiple-choice loglikelihood through kvferry's
`/v1/completions` (echo + logprobs, token-id prompts) in each precision, against lm-eval's own
`hf` model in fp32 over the same weights (issue 41: within 1 point of HF fp32).

The task is local (mc_questions.jsonl beside this file: 100 general-knowledge questions × 4
choices, 400 loglikelihood requests, zero-shot, `Question: …\\nAnswer:`), so the run needs no
data set from a hub: one question is 1 point of accuracy. Each mode runs on a stack of its own
(two Redis, one worker, the API: the path users take), started with that mode's settings.
Needs the `eval` extra (lm-eval).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from ops.bench.engine.precision import mode_name
from ops.redis.server import free_port
from ops.settings import Settings
from ops.stack.stack import Stack
from workers.engine.model.loader import resolve_model_dir

TASK = "kvferry_mc"
QUESTIONS = Path(__file__).with_name("mc_questions.jsonl")
# The modes the issue asks for: fp32 (the path the suite keeps exact), bf16 weights + bf16 KV
# (`auto` on a CPU with AVX512-BF16), int8 weights, int8 KV.
LM_EVAL_MODES = (
    ("float32", "float32", "none"),
    ("bfloat16", "bfloat16", "none"),
    ("bfloat16", "bfloat16", "int8"),
    ("bfloat16", "int8", "none"),
)


def task_config() -> dict[str, Any]:
    return {
        "task": TASK,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(QUESTIONS)}},
        "test_split": "test",
        "output_type": "multiple_choice",
        "doc_to_text": "Question: {{question}}\nAnswer:",
        "doc_to_choice": "choices",
        "doc_to_target": "answer",
        "metric_list": [
            {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
            {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True},
        ],
    }


def _evaluate(model: str, model_args: str, batch_size: int, limit: int | None) -> dict[str, Any]:
    from lm_eval import simple_evaluate

    started = time.perf_counter()
    out = simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=[task_config()],
        batch_size=batch_size,
        limit=limit,
        log_samples=True,
        bootstrap_iters=0,
    )
    assert out is not None
    scores = out["results"][TASK]
    samples = sorted(out["samples"][TASK], key=lambda s: s["doc_id"])
    return {
        "lm_eval_acc": scores["acc,none"],
        "lm_eval_acc_norm": scores["acc_norm,none"],
        "loglikelihoods": [[float(r[0]) for r in s["filtered_resps"]] for s in samples],
        "seconds": time.perf_counter() - started,
    }


def _picks(lls: list[list[float]]) -> list[int]:
    return [max(range(len(row)), key=row.__getitem__) for row in lls]


def compare(mode: dict[str, Any], hf: dict[str, Any]) -> dict[str, Any]:
    """The mode's figures against HF fp32's: deltas in points (1 point = 0.01 accuracy)."""
    lls, ref = mode.pop("loglikelihoods"), hf["loglikelihoods"]
    pairs = [(a, b) for row, ref_row in zip(lls, ref, strict=True) for a, b in zip(row, ref_row, strict=True)]
    return {
        **mode,
        "lm_eval_acc_delta_vs_hf_fp32": round(100 * (mode["lm_eval_acc"] - hf["lm_eval_acc"]), 4),
        "lm_eval_acc_norm_delta_vs_hf_fp32": round(
            100 * (mode["lm_eval_acc_norm"] - hf["lm_eval_acc_norm"]), 4
        ),
        "answers_changed_vs_hf_fp32": sum(a != b for a, b in zip(_picks(lls), _picks(ref), strict=True)),
        "max_abs_loglikelihood_delta": max(abs(a - b) for a, b in pairs),
    }


def _served(
    settings: Settings, mode: tuple[str, str, str], model_dir: Path, batch_size: int, limit: int | None
) -> dict[str, Any]:
    dtype, kv, quantization = mode
    chosen = settings.with_overrides(
        api_port=free_port(), dtype=dtype, kv_cache_dtype=kv, quantization=quantization, torch_threads=1
    )
    run_dir = settings.cache_dir / "run" / f"lm-eval-{free_port()}"
    with Stack(chosen, 1, run_dir=run_dir, with_flower=False) as stack:
        stack.wait_ready()
        args = (
            f"model={chosen.served_model},base_url={stack.api_url}/v1/completions,"
            f"tokenizer={model_dir},tokenized_requests=True,num_concurrent=1,max_retries=2"
        )
        return _evaluate("local-completions", args, batch_size, limit)


def run_lm_eval_bench(
    settings: Settings,
    modes: list[str] | None = None,
    batch_size: int = 4,
    limit: int | None = None,
    baseline: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """HF fp32 (lm-eval's `hf`, one torch thread; or `baseline`, an earlier run's `hf_fp32` over
    the same questions: it is deterministic) then each mode on its own one-worker stack (one torch
    thread: the machine is shared); `limit`: the first questions only."""
    chosen = [m for m in LM_EVAL_MODES if not modes or mode_name(*m) in modes]
    if modes and len(chosen) != len(modes):
        known = ", ".join(mode_name(*m) for m in LM_EVAL_MODES)
        raise ValueError(f"modes must be among {known}, got {', '.join(modes)}")
    model_dir = resolve_model_dir(settings.model, settings.cache_dir)
    torch.set_num_threads(1)
    if baseline is None:
        hf = _evaluate("hf", f"pretrained={model_dir},dtype=float32,device=cpu", batch_size, limit)
    else:
        hf = {**baseline, "loglikelihoods": baseline["loglikelihoods"][:limit], "reused": True}
        if limit is not None and limit != len(baseline["loglikelihoods"]):
            raise ValueError("a baseline is reused whole: run it with the same --limit")
    results: dict[str, Any] = {
        "task": TASK,
        "questions": len(hf["loglikelihoods"]),
        "choices": 4,
        "batch_size": batch_size,
        "torch_threads": 1,
        "hf_fp32": hf,
        "modes": {},
    }
    for mode in chosen:
        served = _served(settings, mode, model_dir, batch_size, limit)
        results["modes"][mode_name(*mode)] = compare(served, hf)
    return results


def report(results: dict[str, Any]) -> str:
    hf = results["hf_fp32"]
    lines = [
        f"{results['questions']} questions × {results['choices']} choices; lm-eval hf fp32: "
        f"acc {hf['lm_eval_acc']:.3f} / acc_norm {hf['lm_eval_acc_norm']:.3f}",
        "mode                   acc    Δ pts  acc_norm  Δ pts  changed  max|Δll|",
    ]
    for name, m in results["modes"].items():
        lines.append(
            f"{name:<20} {m['lm_eval_acc']:>6.3f} {m['lm_eval_acc_delta_vs_hf_fp32']:>+6.1f} "
            f"{m['lm_eval_acc_norm']:>9.3f} {m['lm_eval_acc_norm_delta_vs_hf_fp32']:>+6.1f} "
            f"{m['answers_changed_vs_hf_fp32']:>8} {m['max_abs_loglikelihood_delta']:>9.2e}"
        )
    return "\n".join(lines)
