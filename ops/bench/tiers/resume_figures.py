"""The figures `kvferry bench tiers` reports of its resume part (ops/bench/tiers/resume.py), each under
a key that names the history length it was measured at."""

from __future__ import annotations

from typing import Any

FULL_LENGTH = 2048  # the full run's headline length; issues name its keys (headline_keys)


def headline_keys(length: int) -> dict[str, str]:
    """The report's key of each figure measured at the headline length: the full run's own names
    at 2,048, names that carry the length at any other (a quick run's 1,024)."""
    figures = ("resume_ratio", "fetch_mb_s", "fetch_vs_raw_mget", "stages_mb_s")
    names = [f"{f}_{length}" for f in figures]
    if length == FULL_LENGTH:
        names = ["resume_ratio_2048", "fetch_mb_s", "fetch_vs_raw_mget", "stages_mb_s"]
    return dict(zip(figures, names, strict=True))


def summary(
    rows: list[dict[str, Any]], stages: dict[str, float], headline: int, reps: int, tier_dtype: str
) -> dict[str, Any]:
    """bench_resume's report: every row, then the figures of the headline length's row."""
    paying = [r["history_tokens"] for r in rows if r["ratio"] < 1.0]
    ref = next(r for r in rows if r["history_tokens"] == headline)
    keys = headline_keys(headline)
    raw = stages.get("network_parse_concurrent_mb_s")
    return {
        "rows": rows,
        "reps": reps,
        "tier_dtype": tier_dtype,
        "headline_tokens": headline,
        keys["fetch_mb_s"]: ref["fetch_mb_s"],
        keys["stages_mb_s"]: stages,
        # Against the same run's plain redis-py + hiredis MGETs of the same packs, nothing decoded,
        # with as many in flight on as many connections as the tier's fetch keeps.
        keys["fetch_vs_raw_mget"]: ref["fetch_mb_s"] / raw if raw else None,
        keys["resume_ratio"]: ref["ratio"],
        "loading_pays_from_tokens": min(paying) if paying else None,
    }


def headline(resume: dict[str, Any]) -> dict[str, Any]:
    """The figures `kvferry bench tiers` lifts to the top of its report, under the same keys."""
    keys = headline_keys(resume["headline_tokens"])
    lifted = (keys["resume_ratio"], keys["fetch_mb_s"], keys["fetch_vs_raw_mget"], "loading_pays_from_tokens")
    return {k: resume[k] for k in lifted}
