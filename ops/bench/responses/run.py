"""The Responses bench: a kvferry stack of N workers with session_move_after_turns = K, so that
each conversation's turn K+1 (by previous_response_id) goes to another worker than its turn K.
For each conversation: the moved turn's TTFT; the same turn sent again by the same
previous_response_id (now on the worker that kept the conversation: its last worker holds it in
its pool); and the same history as one chat request with a fresh cache_salt (a cold recompute).
Ratios are medians over conversations; then background submissions' answer time (p50, ms)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ops.bench.responses.client import background_submit_s, recompute_ttft, respond
from ops.redis.server import free_port
from ops.settings import Settings
from ops.stack.stack import Stack


@dataclass(frozen=True, slots=True)
class Config:
    conversations: int = 16
    turns: int = 8
    move_after: int = 4
    output_tokens: int = 8
    backgrounds: int = 16
    system_words: int = 200  # a long first prompt: the history the moved turn must not recompute
    think_s: float = 1.0  # between a turn's answer and the next turn (a user reads, a tool runs)


def _conversation(http: httpx.Client, model: str, c: int, cfg: Config) -> dict[str, Any]:
    system = " ".join(f"rule{c}-{i}" for i in range(cfg.system_words))
    history = [{"role": "user", "content": f"{system}\nquestion 1"}]
    turn = respond(http, model, history[0]["content"], None, cfg.output_tokens)
    turns = [turn]
    for t in range(2, cfg.move_after + 2):
        history += [{"role": "assistant", "content": turn.text}, {"role": "user", "content": f"question {t}"}]
        previous = turn.response_id
        time.sleep(cfg.think_s)
        turn = respond(http, model, f"question {t}", previous, cfg.output_tokens)
        turns.append(turn)
    moved, before = turns[-1], turns[-2]
    time.sleep(cfg.think_s)
    kept = respond(http, model, history[-1]["content"], previous, cfg.output_tokens)  # the same turn again
    cold = recompute_ttft(http, model, history)
    return {
        "moved": moved.worker != before.worker,
        "kept_on_mover": kept.worker == moved.worker,
        "moved_ttft_s": moved.ttft_s,
        "kept_ttft_s": kept.ttft_s,
        "recompute_ttft_s": cold,
        "moved_cached_tokens": moved.cached_tokens,
        "moved_input_tokens": moved.input_tokens,
    }


def run(
    settings: Settings, workers: int, cfg: Config, run_dir: Path | None, log: Callable[[str], None]
) -> dict[str, Any]:
    stack_settings = settings.with_overrides(session_move_after_turns=cfg.move_after, api_port=free_port())
    with Stack(stack_settings, workers, run_dir=run_dir, with_flower=False) as stack:
        log(f"starting a stack of {workers} workers (logs in {stack.run_dir})")
        stack.wait_ready()
        model = stack_settings.served_model
        with httpx.Client(base_url=stack.api_url, timeout=600) as http:
            rows = []
            for c in range(cfg.conversations):
                rows.append(_conversation(http, model, c, cfg))
                log(f"conversation {c + 1}/{cfg.conversations}: {rows[-1]}")
            submits = [background_submit_s(http, model, f"background {i}")[0] for i in range(cfg.backgrounds)]
            time.sleep(1)
    moved = [r for r in rows if r["moved"]]
    return {
        "conversations": cfg.conversations,
        "turns_before_move": cfg.move_after,
        "moved_conversations": len(moved),
        "moved_vs_kept_ttft": statistics.median(r["moved_ttft_s"] / r["kept_ttft_s"] for r in moved)
        if moved
        else None,
        "moved_vs_recompute_ttft": statistics.median(r["moved_ttft_s"] / r["recompute_ttft_s"] for r in moved)
        if moved
        else None,
        "moved_ttft_p50_s": statistics.median(r["moved_ttft_s"] for r in moved) if moved else None,
        "moved_cached_fraction_p50": statistics.median(
            r["moved_cached_tokens"] / r["moved_input_tokens"] for r in moved
        )
        if moved
        else None,
        "background_submit_p50_ms": statistics.median(submits) * 1000,
        "rows": rows,
        "workers": workers,
    }
