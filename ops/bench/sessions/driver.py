"""The benchmark end to end against one base URL: one level of --sessions, or --find-capacity's
levels, into the JSON document (stable keys) the command writes; a line per level as it ends."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ops.bench.sessions.capacity import search
from ops.bench.sessions.client import Options, chat_turn
from ops.bench.sessions.run import LevelRun, client_for, probe, run_level
from ops.bench.sessions.stats import Record, level_line, meets, sure_miss
from ops.bench.sessions.workload import plan_sessions, system_prompts


@dataclass(frozen=True, slots=True)
class Config:
    base_url: str
    api_key: str = ""
    model: str | None = None
    sessions: int = 8
    turns: int = 8
    output_tokens: int = 32
    think_mean_s: float = 1.0
    seed: int = 0
    system_prompts: int = 4
    find_capacity: bool = False
    slo_ttft_s: float = 2.0
    slo_tpot_s: float = 0.25
    max_sessions: int = 64
    max_level_s: float = 300.0
    recompute_turn: int | None = None  # move mode: resend this turn with a fresh cache salt


@dataclass(slots=True)
class Result:
    doc: dict[str, Any]
    records: list[Record]
    levels: list[dict[str, Any]]
    runs: list[LevelRun]


async def _warm_up(cfg: Config, opts: Options, systems: list[str], log: Callable[[str], None]) -> None:
    """Each shared system prompt once, one at a time, before any level (not measured): a serving
    deployment keeps its system prompts warm, and without this the first level that uses a prompt
    would pay its cold prefill in that level's p95, whatever the server."""
    async with client_for(cfg.base_url, 1) as client:
        for i, system in enumerate(systems):
            messages = [{"role": "system", "content": system}, {"role": "user", "content": "Hello."}]
            turn = await chat_turn(client, opts, messages, f"warm-up-{cfg.seed}-{i}")
            if turn.error:
                log(f"warm-up of system prompt {i} failed: {turn.error}")


def run_bench(cfg: Config, log: Callable[[str], None] = print) -> Result:
    return asyncio.run(_run(cfg, log))


async def _run(cfg: Config, log: Callable[[str], None]) -> Result:
    server = await probe(cfg.base_url, cfg.model, cfg.api_key)
    log(f"server: {server.kind}, model {server.model!r}")
    opts = Options(server, cfg.output_tokens, api_key=cfg.api_key)
    systems = system_prompts(cfg.system_prompts)
    levels: list[dict[str, Any]] = []
    runs: list[LevelRun] = []
    await _warm_up(cfg, opts, systems, log)

    async def level(n: int) -> bool:
        plans = plan_sessions(len(levels), n, cfg.turns, cfg.think_mean_s, cfg.seed, systems)
        total = n * cfg.turns
        miss = (
            (lambda rs: sure_miss(rs, total, cfg.slo_ttft_s, cfg.slo_tpot_s)) if cfg.find_capacity else None
        )
        async with client_for(cfg.base_url, n) as client:
            summary, run = await run_level(client, opts, plans, cfg.max_level_s, cfg.recompute_turn, miss)
        summary["met"] = meets(summary, cfg.slo_ttft_s, cfg.slo_tpot_s)
        levels.append(summary)
        runs.append(run)
        log(level_line(summary, summary["met"] if cfg.find_capacity else None))
        return bool(summary["met"])

    doc: dict[str, Any] = {"server": server.kind, "model": server.model, "base_url": cfg.base_url}
    if cfg.find_capacity:
        steps = search(cfg.max_sessions)
        try:
            n = next(steps)
            while True:
                n = steps.send(await level(n))
        except StopIteration as stop:
            best = int(stop.value)
        doc["capacity"] = [
            {"sessions": lv["sessions"], "ttft_p95_s": lv["ttft_p95_s"], "tpot_p95_s": lv["tpot_p95_s"],
             "met": lv["met"], "wall_s": lv["wall_s"], "timed_out": lv["timed_out"],
             "missed_early": lv["missed_early"]}
            for lv in levels
        ]  # fmt: skip
        doc["sessions_at_slo"] = best
        shown = next((lv for lv in levels if lv["sessions"] == best), levels[-1])
    else:
        await level(cfg.sessions)
        shown = levels[0]
    doc.update(
        {
            k: v
            for k, v in shown.items()
            if k not in ("met", "wall_s", "timed_out", "missed_early", "requests")
        }
    )
    doc.update(
        slo_ttft_s=cfg.slo_ttft_s, slo_tpot_s=cfg.slo_tpot_s, output_tokens=cfg.output_tokens,
        think_mean_s=cfg.think_mean_s, seed=cfg.seed, system_prompts=cfg.system_prompts,
        ignore_eos=opts.ignore_eos and server.kind != "other", refused_fields=sorted(set(opts.refused)),
        levels=levels, wall_s=sum(lv["wall_s"] for lv in levels),
    )  # fmt: skip
    records = [r for run in runs for r in run.records]
    return Result(doc, records, levels, runs)
