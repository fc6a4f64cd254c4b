"""One level: N concurrent sessions, each T turns; every turn resends the whole history (with the
reply text the client got) plus a new user message, after a seeded think time. A level that runs
past `max_level_s` is cut off: its unfinished sessions are cancelled and it counts as missed. So is
one whose `early_miss` check says the SLO is already lost (find-capacity: the slow requests so far
are enough to put the level's p95 past it, whatever the rest do)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from tqdm import tqdm

from ops.bench.sessions.client import Options, Server, Turn, api_root, chat_turn, detect
from ops.bench.sessions.stats import Record, summary
from ops.bench.sessions.workload import SessionPlan


@dataclass(slots=True)
class LevelRun:
    """What one level left: its records, and in move mode each session's recompute of one turn."""

    records: list[Record] = field(default_factory=list)
    turns: dict[tuple[str, int], Turn] = field(default_factory=dict)
    recomputes: dict[str, Turn] = field(default_factory=dict)


def _record(n: int, sid: str, turn: int, t: Turn, output_tokens: int) -> Record:
    short = not t.error and t.completion_tokens < output_tokens
    return Record(n, sid, turn, t.ttft_s, t.tpot_s, t.prompt_tokens, t.cached_tokens, t.completion_tokens,
                  t.worker, t.error, short, *(t.sources or (None, None, None, None)))  # fmt: skip


async def _session(
    client: httpx.AsyncClient,
    opts: Options,
    plan: SessionPlan,
    n: int,
    out: LevelRun,
    bar: tqdm[Any],
    recompute_turn: int | None,
    miss: Callable[[list[Record]], bool] | None,
    missed: asyncio.Event,
) -> None:
    await asyncio.sleep(plan.start_delay_s)
    messages = [{"role": "system", "content": plan.system}]
    for i, user in enumerate(plan.users):
        if i:
            await asyncio.sleep(plan.thinks_s[i - 1])
        messages.append({"role": "user", "content": user})
        turn = await chat_turn(client, opts, messages, plan.sid)
        out.turns[(plan.sid, i + 1)] = turn
        out.records.append(_record(n, plan.sid, i + 1, turn, opts.output_tokens))
        bar.update(1)
        if miss is not None and miss(out.records):
            missed.set()
        if turn.error:
            return  # a session whose turn failed has no reply to build on
        if recompute_turn == i + 1:  # the same request, nothing cached for it anywhere
            out.recomputes[plan.sid] = await chat_turn(
                client, opts, messages, plan.sid, salt=f"re-{plan.sid}"
            )
        messages.append({"role": "assistant", "content": turn.text})


async def run_level(
    client: httpx.AsyncClient,
    opts: Options,
    plans: list[SessionPlan],
    max_level_s: float,
    recompute_turn: int | None = None,
    early_miss: Callable[[list[Record]], bool] | None = None,
) -> tuple[dict[str, Any], LevelRun]:
    """Run one level; its summary (with wall_s, timed_out, missed_early) and what it left."""
    n = len(plans)
    turns = len(plans[0].users) if plans else 0
    out = LevelRun()
    bar = tqdm(total=n * turns, unit="req", desc=f"{n} sessions", leave=False)
    started = time.perf_counter()
    missed = asyncio.Event()
    tasks = {
        asyncio.ensure_future(_session(client, opts, p, n, out, bar, recompute_turn, early_miss, missed))
        for p in plans
    }
    stopper = asyncio.ensure_future(missed.wait())
    pending = set(tasks)
    while pending and not missed.is_set():
        left = started + max_level_s - time.perf_counter()
        if left <= 0:
            break
        done, _ = await asyncio.wait(pending | {stopper}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        pending -= done
    for task in (*pending, stopper):
        task.cancel()
    await asyncio.gather(*tasks, stopper, return_exceptions=True)
    bar.close()
    level = summary(out.records, n, turns)
    level["wall_s"] = time.perf_counter() - started
    level["missed_early"] = missed.is_set()
    level["timed_out"] = bool(pending) and not missed.is_set()
    return level, out


def client_for(base_url: str, sessions: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=2 * sessions + 4, max_keepalive_connections=2 * sessions + 4)
    return httpx.AsyncClient(base_url=api_root(base_url), timeout=600, limits=limits)


async def probe(base_url: str, model: str | None, api_key: str) -> Server:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(base_url=api_root(base_url), timeout=30, headers=headers) as client:
        return await detect(client, model)
