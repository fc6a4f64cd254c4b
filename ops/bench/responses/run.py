"""The Responses bench: a kvferry stack of N workers with session_move_after_turns = 3 and
session_move_every_turns = 3, so each conversation's turns move between workers every other turn.
Turns 3, 5, 7 (by previous_response_id) are each sent twice from the same previous response: first
with another new input of as many tokens, on the worker that served the turn before and keeps the
whole conversation (the "kept" baseline: the same turn index and prompt length, not moved; the
session counts it as a turn, hence K = M = 3), then the turn itself, forced to the other worker.
For each moved turn: its TTFT, the kept one's, where each one's time went (ops/bench/responses/
split.py) and where its prompt's KV came from; for each conversation's last moved turn, the same
history as one chat request with a fresh cache_salt (a cold recompute). Ratios are medians over
moved turns (recompute: over conversations); then background submissions' answer time (p50, ms)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis

from ops.bench.responses.client import background_submit_s, recompute_ttft, respond
from ops.bench.responses.split import turn_split
from ops.redis.server import free_port
from ops.settings import Settings
from ops.stack.stack import Stack

MOVE_AFTER, MOVE_EVERY = 3, 3  # the session's turn counts: each moved turn's kept baseline too
KEPT_WORD = "topic"  # the kept baseline's "topic 5" for the moved "question 5": as many tokens (SmolLM2)


@dataclass(frozen=True, slots=True)
class Config:
    conversations: int = 16
    turns: int = 8
    output_tokens: int = 8
    backgrounds: int = 16
    system_words: int = 200  # a long first prompt: the history the moved turn must not recompute
    think_s: float = 1.0  # between a turn's answer and the next turn (a user reads, a tool runs)


def _conversation(
    http: httpx.Client, rds: redis.Redis, model: str, c: int, cfg: Config
) -> list[dict[str, Any]]:
    """The conversation's moved turns: (moved, kept) TTFTs and where each one's time went; the last
    with its recompute."""
    # Conversations of different lengths: their turns end at different places in a block. The kept
    # baseline (sent first) and the moved turn share the previous turn's last token and the chat
    # template's next header (5 tokens) before their texts differ: when those fill the block the
    # previous turn's tail is in, that block (the kept one's, written through) serves the moved
    # turn. moved_vs_kept_ttft_same_compute counts only the turns where it did not.
    system = " ".join(f"rule{c}-{i}" for i in range(cfg.system_words + c))
    history = [{"role": "user", "content": f"{system}\nquestion 1"}]
    turn = respond(http, model, history[0]["content"], None, cfg.output_tokens)
    rows: list[dict[str, Any]] = []
    for t in range(2, cfg.turns + 1):
        history += [{"role": "assistant", "content": turn.text}, {"role": "user", "content": f"question {t}"}]
        previous, before = turn.response_id, turn
        kept = None
        if t % 2 == 1:  # a moved turn: first the same turn where the conversation is kept
            time.sleep(cfg.think_s)
            # On the worker that served turn t - 1 and keeps all of it: what the moved turn would
            # cost had it not moved. Another text of as many tokens, which differs from its first
            # token on: a block the two share (the moved turn's finding it through Redis) would
            # then have to hold the whole chat-template header before it, which it rarely can.
            kept = respond(http, model, f"{KEPT_WORD} {t}", previous, cfg.output_tokens)
        time.sleep(cfg.think_s)
        turn = respond(http, model, f"question {t}", previous, cfg.output_tokens)
        if kept is not None:
            rows.append(
                {
                    "turn": t,
                    "moved": turn.worker != before.worker,
                    "kept_on_keeper": kept.worker == before.worker,
                    "moved_ttft_s": turn.ttft_s,
                    "kept_ttft_s": kept.ttft_s,
                    "moved_cached_tokens": turn.cached_tokens,
                    "moved_input_tokens": turn.input_tokens,
                    "kept_input_tokens": kept.input_tokens,
                    "moved_sources": turn.sources,
                    "kept_sources": kept.sources,
                    "moved_split": turn_split(rds, turn.response_id, turn.sent_at, turn.ttft_s),
                    "kept_split": turn_split(rds, kept.response_id, kept.sent_at, kept.ttft_s),
                }
            )
    rows[-1]["recompute_ttft_s"] = recompute_ttft(
        http, model, history[:-2] if cfg.turns % 2 == 0 else history
    )
    return rows


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _computed(row: dict[str, Any], side: str) -> int:
    return int(row[f"{side}_sources"].get("computed", -1))


def _by_turn(moved: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Per moved turn index: the TTFT ratio, and the medians of the prompt tokens each computed
    and of each one's time in the engine and before it (ms)."""
    out: dict[int, dict[str, Any]] = {}
    for t in sorted({r["turn"] for r in moved}):
        rs = [r for r in moved if r["turn"] == t]
        row: dict[str, Any] = {
            "n": len(rs),
            "moved_vs_kept_ttft": _median([r["moved_ttft_s"] / r["kept_ttft_s"] for r in rs]),
        }
        for side in ("moved", "kept"):
            row[f"{side}_computed_tokens"] = _median([r[f"{side}_sources"].get("computed", 0) for r in rs])
            for stage in ("api_queue_ms", "setup_ms", "engine_ms"):
                row[f"{side}_{stage}"] = _median(
                    [r[f"{side}_split"][stage] for r in rs if r[f"{side}_split"]]
                )
        out[t] = row
    return out


def run(
    settings: Settings, workers: int, cfg: Config, run_dir: Path | None, log: Callable[[str], None]
) -> dict[str, Any]:
    moves = {"session_move_after_turns": MOVE_AFTER, "session_move_every_turns": MOVE_EVERY}
    stack_settings = settings.with_overrides(**moves, api_port=free_port())
    with Stack(stack_settings, workers, run_dir=run_dir, with_flower=False) as stack:
        log(f"starting a stack of {workers} workers (logs in {stack.run_dir})")
        stack.wait_ready()
        model = stack_settings.served_model
        rds = redis.Redis.from_url(stack.settings.queue_url)
        with httpx.Client(base_url=stack.api_url, timeout=600) as http:
            rows: list[dict[str, Any]] = []
            for c in range(cfg.conversations):
                rows += _conversation(http, rds, model, c, cfg)
                log(f"conversation {c + 1}/{cfg.conversations}: {rows[-1]}")
            submits = [background_submit_s(http, model, f"background {i}")[0] for i in range(cfg.backgrounds)]
            time.sleep(1)
    moved = [r for r in rows if r["moved"]]
    cold = [r for r in moved if "recompute_ttft_s" in r]
    return {
        "conversations": cfg.conversations,
        "turns": cfg.turns,
        "moved_turns": len(moved),
        "moved_turns_expected": len(rows),
        "moved_vs_kept_ttft": _median([r["moved_ttft_s"] / r["kept_ttft_s"] for r in moved]),
        "moved_vs_kept_ttft_same_compute": _median(
            [
                r["moved_ttft_s"] / r["kept_ttft_s"]
                for r in moved
                if _computed(r, "moved") == _computed(r, "kept")
            ]
        ),
        "same_compute_turns": sum(1 for r in moved if _computed(r, "moved") == _computed(r, "kept")),
        "moved_vs_recompute_ttft": _median([r["moved_ttft_s"] / r["recompute_ttft_s"] for r in cold]),
        "moved_ttft_p50_s": _median([r["moved_ttft_s"] for r in moved]),
        "kept_ttft_p50_s": _median([r["kept_ttft_s"] for r in moved]),
        "recompute_ttft_p50_s": _median([r["recompute_ttft_s"] for r in cold]),
        "moved_cached_fraction_p50": _median(
            [r["moved_cached_tokens"] / r["moved_input_tokens"] for r in moved]
        ),
        "kept_on_keeper": sum(1 for r in moved if r["kept_on_keeper"]),
        "kept_same_prompt_tokens": sum(1 for r in moved if r["kept_input_tokens"] == r["moved_input_tokens"]),
        "by_turn": _by_turn(moved),
        "background_submit_p50_ms": statistics.median(submits) * 1000,
        "rows": rows,
        "workers": workers,
    }
