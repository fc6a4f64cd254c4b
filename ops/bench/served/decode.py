"""`kvferry bench served-decode`: the served TPOT against the engine's own decode-only step, with
the admission hold (prefill_batch_hold, workers/engine/scheduling/admission_hold.py) on and off in one run.

Each run starts a 1-worker stack with the hold on or off (alternated, `rounds` of each), drives
vLLM `bench serve`'s random workload through the API (ops/bench/served/client.py), reads from
the worker's heartbeat the seconds its engine spent in decode-only steps and in steps with
prefill rows, and then, with the stack stopped, times the engine in this process on a decode-only
batch of `concurrency` sequences (ops/bench/engine/decode.py): that run's pair. The headline key
"served_tpot_vs_engine_tpot" is the hold's default setting's median ratio.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from broker.defaults import DEFAULTS
from broker.redis.client import connect
from broker.sampling import SamplingParams
from broker.worker_registry import live_workers
from ops.bench.engine.decode import _decode_only
from ops.bench.served.client import random_prompts, run_load, served_figures
from ops.redis.server import free_port
from ops.settings import Settings
from ops.stack.stack import Stack
from workers.engine.factory import build_engine
from workers.engine.llm_engine import LLMEngine
from workers.engine.model.loader import load_model

_STEP_KEYS = ("seconds_decode_only", "seconds_with_prefill", "num_held_steps")


def _engine_figures(settings: Settings) -> dict[str, float]:
    workers = live_workers(connect(settings.queue_url))
    e = workers[0].engine if workers else None
    return {k: float(getattr(e, k)) if e is not None else 0.0 for k in _STEP_KEYS}


def _served_run(
    settings: Settings, run_dir: Path, prompts: list[list[int]], output_len: int, concurrency: int, label: str
) -> dict[str, Any]:
    with Stack(settings.with_overrides(api_port=free_port()), 1, run_dir=run_dir, with_flower=False) as stack:
        stack.wait_ready()
        model = stack.settings.served_model
        run_load(stack.api_url, model, random_prompts(4, 32, seed=99), 8, 4, f"{label}: warm-up")
        time.sleep(2 * stack.settings.broker_config().heartbeat_interval_s)
        before = _engine_figures(stack.settings)
        records, wall = run_load(stack.api_url, model, prompts, output_len, concurrency, label)
        time.sleep(2 * stack.settings.broker_config().heartbeat_interval_s)
        after = _engine_figures(stack.settings)
    out = served_figures(records, wall)
    spent = {k: after[k] - before[k] for k in _STEP_KEYS}
    total = spent["seconds_decode_only"] + spent["seconds_with_prefill"]
    out["prefill_step_time_share"] = spent["seconds_with_prefill"] / total if total else None
    out["held_steps"] = int(spent["num_held_steps"])
    return out


def _engine_tpot(engine: LLMEngine, batch: int, input_len: int, output_len: int, seed: int) -> float:
    engine.pool.reset_prefix_cache()
    prompts = random_prompts(batch, input_len, seed)
    return _decode_only(engine, prompts, output_len) / (output_len - 1)


def run_served_decode(
    settings: Settings,
    run_dir: Path,
    budget_s: float,
    rounds: int = 2,
    requests: int = 64,
    concurrency: int = 16,
    input_len: int = 128,
    output_len: int = 64,
    log: Any = print,
) -> dict[str, Any]:
    threads = settings.torch_threads or max(1, os.cpu_count() or 1)  # what a lone worker gets
    settings = settings.with_overrides(torch_threads=threads)
    loaded = load_model(settings.model, settings.dtype, settings.device, settings.cache_dir)
    engine = build_engine(settings.engine_config(), loaded)
    engine.generate([[7, 8, 9]], SamplingParams(max_tokens=2))  # first-forward warm-up
    sides = {"hold_on": budget_s, "hold_off": 0.0}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    for r in range(rounds):
        order = list(sides) if r % 2 else list(reversed(sides))  # off, on; then on, off; ...
        for name in order:
            label = f"round {r + 1}/{rounds} {name}"
            log(f"{label}: starting a 1-worker stack (prefill_batch_hold={sides[name]})")
            torch.set_num_threads(1)  # the bench process is only a client now
            prompts = random_prompts(requests, input_len, seed=1000 * r + len(runs[name]))
            run = _served_run(
                settings.with_overrides(prefill_batch_hold=sides[name]),
                run_dir / f"{name}-{r}", prompts, output_len, concurrency, label,
            )  # fmt: skip
            torch.set_num_threads(threads)
            run["engine_tpot_s"] = _engine_tpot(engine, concurrency, input_len, output_len, seed=7 + r)
            if run["served_tpot_median_s"]:
                run["served_tpot_vs_engine_tpot"] = run["served_tpot_median_s"] / run["engine_tpot_s"]
            log(f"{label}: {_line(run)}")
            runs[name].append(run)
    return figures(runs, settings, budget_s, requests, concurrency, input_len, output_len)


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def figures(
    runs: dict[str, list[dict[str, Any]]],
    settings: Settings,
    budget_s: float,
    requests: int,
    concurrency: int,
    input_len: int,
    output_len: int,
) -> dict[str, Any]:
    keys = ("served_tpot_median_s", "engine_tpot_s", "served_tpot_vs_engine_tpot", "ttft_median_s",
            "output_tok_s", "prefill_step_time_share")  # fmt: skip
    out: dict[str, Any] = {
        "model": settings.served_model,
        "workload": {
            "requests": requests,
            "concurrency": concurrency,
            "input_len": input_len,
            "output_len": output_len,
        },
        "torch_threads": settings.torch_threads,
        "prefill_batch_hold_on": budget_s,
        "prefill_batch_hold_default": DEFAULTS.prefill_batch_hold,
        "runs": runs,
    }
    for side, side_runs in runs.items():
        for key in keys:
            out[f"{side}_{key}"] = _median(side_runs, key)
    default = "hold_on" if DEFAULTS.prefill_batch_hold > 0 else "hold_off"
    out["served_tpot_vs_engine_tpot"] = out[f"{default}_served_tpot_vs_engine_tpot"]
    on, off = runs["hold_on"], runs["hold_off"]
    for key, short in (
        ("served_tpot_median_s", "tpot"),
        ("ttft_median_s", "ttft"),
        ("output_tok_s", "tok_s"),
    ):
        pairs = [_ratio(a.get(key), b.get(key)) for a, b in zip(on, off, strict=False)]
        kept = [p for p in pairs if p is not None]
        out[f"hold_on_vs_off_{short}_pairs"] = kept
        out[f"hold_on_vs_off_{short}"] = statistics.median(kept) if kept else None
    return out


def _line(run: dict[str, Any]) -> str:
    def f(key: str, scale: float = 1.0, fmt: str = ".1f") -> str:
        v = run.get(key)
        return "n/a" if v is None else format(v * scale, fmt)

    return (
        f"served TPOT {f('served_tpot_median_s', 1e3)} ms, engine {f('engine_tpot_s', 1e3)} ms "
        f"(x{f('served_tpot_vs_engine_tpot', fmt='.2f')}), TTFT {f('ttft_median_s', 1e3, '.0f')} ms, "
        f"{f('output_tok_s')} tok/s, prefill steps {f('prefill_step_time_share', 100, '.0f')} % of step "
        f"time, {run.get('held_steps')} held steps, {run.get('errors')} errors"
    )


def render(out: dict[str, Any]) -> str:
    lines = [f"served_tpot_vs_engine_tpot {out['served_tpot_vs_engine_tpot']} (target <= 1.3)"]
    for side in ("hold_on", "hold_off"):
        for run in out["runs"][side]:
            lines.append(f"{side}: {_line(run)}")
    for short in ("tpot", "ttft", "tok_s"):
        key = f"hold_on_vs_off_{short}"
        lines.append(f"hold on vs off, {short}: {out[key]} (pairs {out[key + '_pairs']})")
    return "\n".join(lines)
