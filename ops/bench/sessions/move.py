"""Move mode (issue 28 item 5): kvferry only. Starts its own stack of 2+ workers with
`session_move_after_turns=K`, so each session's turn K+1 goes to a worker other than the one that
served its turn K. Reports the moved turn's TTFT vs the same session's turn K
(moved_turn_ttft_ratio), and vs the same request sent again right after it with a fresh
`cache_salt`, so that nothing anywhere hits (moved_vs_recompute): medians over sessions."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from pathlib import Path

from ops.bench.sessions.driver import Config, Result, run_bench
from ops.redis.server import free_port
from ops.settings import Settings
from ops.stack.stack import Stack

MOVE_SETTING = "session_move_after_turns"


def run_move(
    settings: Settings, workers: int, move_after: int, cfg: Config, run_dir: Path | None,
    log: Callable[[str], None] = print,
) -> Result:  # fmt: skip
    if MOVE_SETTING not in Settings.model_fields:
        raise RuntimeError(f"this build has no {MOVE_SETTING} setting (issue 28 part B): cannot force a move")
    if cfg.turns <= move_after:
        raise ValueError(f"--turns must be more than --move-after ({move_after}) for a turn to move")
    stack_settings = settings.with_overrides(**{MOVE_SETTING: move_after}, api_port=free_port())
    with Stack(stack_settings, workers, run_dir=run_dir, with_flower=False) as stack:
        log(f"starting a stack of {workers} workers (logs in {stack.run_dir})")
        stack.wait_ready()
        cfg = dataclasses.replace(cfg, base_url=stack.api_url, recompute_turn=move_after + 1)
        result = run_bench(cfg, log)
    moved = move_figures(result, move_after)
    result.doc.update(moved, workers=workers, move_after=move_after)
    return result


def move_figures(result: Result, k: int) -> dict[str, object]:
    """Medians over the sessions whose turns K and K+1 and the recompute all streamed a token."""
    run = result.runs[-1]
    ratios, vs_recompute, moved = [], [], 0
    for sid, again in run.recomputes.items():
        before, after = run.turns.get((sid, k)), run.turns.get((sid, k + 1))
        if before is None or after is None or before.error or after.error or again.error:
            continue
        moved += bool(before.worker and after.worker and before.worker != after.worker)
        ratios.append(after.ttft_s / before.ttft_s)
        vs_recompute.append(after.ttft_s / again.ttft_s)
    return {
        "moved_turn_ttft_ratio": statistics.median(ratios) if ratios else None,
        "moved_vs_recompute": statistics.median(vs_recompute) if vs_recompute else None,
        "moved_sessions": moved,
        "move_pairs": len(ratios),
        "recompute_ttft_p50_s": statistics.median([t.ttft_s for t in run.recomputes.values() if not t.error])
        if run.recomputes
        else None,
    }
