"""The run's CSV (one row per request) and PNG: TTFT p95 by turn index (a line per N tried), and
TTFT p95 / TPOT p95 by N with the SLO lines."""

from __future__ import annotations

import csv
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from ops.bench.sessions.stats import Record

CSV_FIELDS = ("level", "session", "turn", "ttft_s", "tpot_s", "prompt_tokens", "cached_tokens",
              "completion_tokens", "worker", "error", "stopped_short", "kv_pool", "kv_warm", "kv_redis",
              "kv_computed")  # fmt: skip


def write_csv(path: Path, records: list[Record]) -> None:
    assert set(CSV_FIELDS) == {f.name for f in fields(Record)}
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for r in records:
            writer.writerow(asdict(r))


def plot(path: Path, doc: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    levels = sorted(doc["levels"], key=lambda lv: lv["sessions"])
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for lv in levels:
        rows = [r for r in lv["per_turn"] if r["ttft_p95_s"] is not None]
        a.plot([int(r["turn"][4:]) for r in rows], [r["ttft_p95_s"] * 1000 for r in rows],
               marker="o", label=f"N={lv['sessions']}")  # fmt: skip
    a.xaxis.set_major_locator(MaxNLocator(integer=True))
    a.set_xlabel("turn index")
    a.set_ylabel("TTFT p95 (ms)")
    a.set_title(f"{doc['server']}: TTFT p95 by turn")
    a.legend(fontsize=7)
    ns = [lv["sessions"] for lv in levels]
    b.plot(ns, [(lv["ttft_p95_s"] or 0) * 1000 for lv in levels], marker="o", label="TTFT p95")
    b.plot(ns, [(lv["tpot_p95_s"] or 0) * 1000 for lv in levels], marker="s", label="TPOT p95")
    b.axhline(doc["slo_ttft_s"] * 1000, linestyle="--", color="C0", label="TTFT SLO")
    b.axhline(doc["slo_tpot_s"] * 1000, linestyle=":", color="C1", label="TPOT SLO")
    if "sessions_at_slo" in doc:
        b.set_title(f"sessions at SLO: {doc['sessions_at_slo']}")
    b.set_xlabel("concurrent sessions N")
    b.set_ylabel("ms")
    b.set_xscale("log", base=2)
    b.set_xticks(ns, [str(n) for n in ns])
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
