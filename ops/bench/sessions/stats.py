"""Per-request records and their summaries: p50/p95 of TTFT and TPOT by turn index and over a
level, mean prompt and cached tokens by turn, replies that stopped short, errors. Pure functions."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Record:
    """One request of one level (the CSV's row)."""

    level: int  # the level's number of concurrent sessions
    session: str
    turn: int  # 1-based
    ttft_s: float
    tpot_s: float
    prompt_tokens: int
    cached_tokens: int | None
    completion_tokens: int
    worker: str
    error: str
    stopped_short: bool
    kv_pool: int | None = None  # kvferry's kv_sources: where the prompt's tokens came from
    kv_warm: int | None = None
    kv_redis: int | None = None
    kv_computed: int | None = None


def percentile(values: list[float], pct: float) -> float | None:
    """The pct-th percentile, linearly interpolated between the sorted samples (None when empty)."""
    xs = sorted(v for v in values if not math.isnan(v))
    if not xs:
        return None
    rank = (len(xs) - 1) * pct / 100
    low = math.floor(rank)
    high = min(low + 1, len(xs) - 1)
    return xs[low] + (xs[high] - xs[low]) * (rank - low)


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def per_turn(records: list[Record], turns: int) -> list[dict[str, Any]]:
    """One entry per turn index 1..turns (errors left out of the timings)."""
    out = []
    for t in range(1, turns + 1):
        ok = [r for r in records if r.turn == t and not r.error]
        cached = [float(r.cached_tokens) for r in ok if r.cached_tokens is not None]
        out.append(
            {
                "turn": f"turn{t}",
                "requests": len(ok),
                "ttft_p50_s": percentile([r.ttft_s for r in ok], 50),
                "ttft_p95_s": percentile([r.ttft_s for r in ok], 95),
                "tpot_p50_s": percentile([r.tpot_s for r in ok], 50),
                "tpot_p95_s": percentile([r.tpot_s for r in ok], 95),
                "prompt_tokens_mean": _mean([float(r.prompt_tokens) for r in ok]),
                "cached_tokens_mean": _mean(cached) if cached else None,
                **_sources_mean(ok),
                "stopped_short": sum(r.stopped_short for r in ok),
                "errors": sum(1 for r in records if r.turn == t and r.error),
            }
        )
    return out


def _sources_mean(ok: list[Record]) -> dict[str, float]:
    """kvferry's mean prompt tokens by source (pool, warm tier, Redis, computed), when it said."""
    out = {}
    for name in ("kv_pool", "kv_warm", "kv_redis", "kv_computed"):
        values = [float(v) for r in ok if (v := getattr(r, name)) is not None]
        if values:
            out[f"{name}_mean"] = statistics.fmean(values)
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summary(records: list[Record], sessions: int, turns: int) -> dict[str, Any]:
    """A level's figures: per-turn entries, overall p50/p95, and turn 8 (or the last) vs turn 1."""
    ok = [r for r in records if not r.error]
    rows = per_turn(records, turns)
    first, last = rows[0]["ttft_p95_s"], rows[-1]["ttft_p95_s"]
    eighth = rows[7]["ttft_p95_s"] if turns >= 8 else None
    return {
        "sessions": sessions,
        "turns": turns,
        "requests": len(records),
        "per_turn": rows,
        "ttft_p50_s": percentile([r.ttft_s for r in ok], 50),
        "ttft_p95_s": percentile([r.ttft_s for r in ok], 95),
        "tpot_p50_s": percentile([r.tpot_s for r in ok], 50),
        "tpot_p95_s": percentile([r.tpot_s for r in ok], 95),
        "stopped_short": sum(r.stopped_short for r in ok),
        "errors": len(records) - len(ok),
        "ttft_p95_turn8_vs_turn1": _ratio(eighth, first),
        "ttft_p95_last_vs_turn1": _ratio(last, first),
        "first_error": next((r.error for r in records if r.error), None),
    }


def meets(level: dict[str, Any], slo_ttft_s: float, slo_tpot_s: float) -> bool:
    """Whether a level met both SLOs: p95 TTFT and p95 TPOT within them, no failed request, and
    not cut off by the level time guard."""
    ttft, tpot = level["ttft_p95_s"], level["tpot_p95_s"]
    return (
        ttft is not None
        and ttft <= slo_ttft_s
        and (tpot is None or tpot <= slo_tpot_s)
        and level["errors"] == 0
        and not level.get("timed_out", False)
        and not level.get("missed_early", False)
    )


def sure_miss(records: list[Record], total: int, slo_ttft_s: float, slo_tpot_s: float) -> bool:
    """Whether a level of `total` requests has already missed, whatever its other requests do: a
    failed request, or so many TTFTs (or TPOTs) past the SLO that every sample from the p95's
    lower neighbour up is past it."""
    if any(r.error for r in records):
        return True
    need = total - math.floor(0.95 * (total - 1))
    slow_ttft = sum(1 for r in records if r.ttft_s > slo_ttft_s)
    slow_tpot = sum(1 for r in records if r.tpot_s > slo_tpot_s)
    return slow_ttft >= need or slow_tpot >= need


def level_line(level: dict[str, Any], met: bool | None = None) -> str:
    """One line per level for the terminal."""

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1000:.0f}"

    verdict = "" if met is None else ("  met" if met else "  MISSED")
    return (
        f"N={level['sessions']:>3}: TTFT p50/p95 {ms(level['ttft_p50_s'])}/{ms(level['ttft_p95_s'])} ms, "
        f"TPOT p50/p95 {ms(level['tpot_p50_s'])}/{ms(level['tpot_p95_s'])} ms, "
        f"errors {level['errors']}, stopped short {level['stopped_short']}, "
        f"{level.get('wall_s', 0):.0f}s{_cut(level)}{verdict}"
    )


def _cut(level: dict[str, Any]) -> str:
    if level.get("timed_out"):
        return " (cut off: --max-level-s)"
    return " (stopped: SLO already missed)" if level.get("missed_early") else ""
