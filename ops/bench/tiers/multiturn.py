"""Multi-turn workload through the whole stack (2 workers): sessions sharing system prompts, each
turn resending the history (the replies as the client got them); prefix hit rate and TTFT per
routing/tier set-up (part of `kvferry bench tiers`). A turn's new messages can never hit, so the
hit rate has a ceiling below 1: `hit_rate_ceiling_after_first_turn` says where it lies."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from ops.bench.tiers.chat_turn import chat_turn
from ops.redis.server import free_port
from ops.settings import Settings
from ops.stack.stack import Stack

QUESTIONS = (
    "Tell me more.",
    "Why is that?",
    "Give an example.",
    "Summarise it.",
    "What else?",
    "And then?",
    "Explain simply.",
    "Is that always true?",
)


async def _session(
    client: httpx.AsyncClient,
    model: str,
    system: str,
    sid: str,
    turns: int,
    max_tokens: int,
    rng: random.Random,
    rows: list[dict[str, Any]],
) -> None:
    messages = [{"role": "system", "content": system}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"{rng.choice(QUESTIONS)} (#{sid}.{turn})"})
        body = {
            "model": model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0,
            "session_id": sid,
        }
        answer = await chat_turn(client, body)
        messages.append({"role": "assistant", "content": answer.text})
        rows.append(answer.row(sid, turn))


def workload(
    settings: Settings,
    routing: str,
    redis_cache: str,
    sessions: int,
    turns: int,
    max_tokens: int,
    run_dir: Path,
) -> dict[str, Any]:
    stack_settings = settings.with_overrides(
        routing=routing, redis_cache_size=redis_cache, api_port=free_port(), torch_threads=1
    )
    # Four system prompts of ~300 tokens (production ones are often longer), shared by the sessions.
    systems = [
        f"You are assistant number {i}. " + "Answer carefully, briefly and politely. " * 40 for i in range(4)
    ]
    rows: list[dict[str, Any]] = []
    with Stack(stack_settings, 2, run_dir=run_dir, with_flower=False) as stack:
        stack.wait_ready()

        async def run() -> None:
            async with httpx.AsyncClient(base_url=stack.api_url, timeout=600) as client:
                await asyncio.gather(
                    *(
                        _session(
                            client,
                            settings.served_model,
                            systems[i % 4],
                            f"s{i}-{routing}-{redis_cache}",
                            turns,
                            max_tokens,
                            random.Random(i),
                            rows,
                        )
                        for i in range(sessions)
                    )
                )

        started = time.perf_counter()
        asyncio.run(run())
        wall = time.perf_counter() - started
    return {
        "routing": routing,
        "redis_tier": stack_settings.redis_tier_on,
        "wall_s": wall,
        **figures(rows),
    }


def figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A workload's figures from its turns' records (ChatTurn.row)."""
    later = [r for r in rows if r["turn"] > 0]
    # What no cache can serve after the first turn: the turn's new messages (its prompt less the
    # last turn's prompt and output) and the last output token, which no step ever computed.
    ends = {(r["sid"], r["turn"]): r["prompt"] + r["completion"] for r in rows}
    novel = sum(r["prompt"] - ends.get((r["sid"], r["turn"] - 1), 0) + 1 for r in later)
    ttfts = sorted(r["ttft_s"] for r in rows if r["ttft_s"] == r["ttft_s"])
    tpots = sorted(r["tpot_s"] for r in rows if r["tpot_s"] == r["tpot_s"])
    workers = Counter(r["worker"] for r in rows)
    return {
        "requests": len(rows),
        "hit_rate": sum(r["cached"] for r in rows) / max(1, sum(r["prompt"] for r in rows)),
        "hit_rate_after_first_turn": sum(r["cached"] for r in later)
        / max(1, sum(r["prompt"] for r in later)),
        # The best any cache could do on those turns (every earlier token reused).
        "hit_rate_ceiling_after_first_turn": 1 - novel / max(1, sum(r["prompt"] for r in later)),
        # Of the tokens any cache could serve on those turns, the share served.
        "hit_share_of_reusable": sum(r["cached"] for r in later)
        / max(1, sum(r["prompt"] for r in later) - novel),
        "ttft_p50_s": _quantile(ttfts, 0.5),
        "ttft_p95_s": _quantile(ttfts, 0.95),
        "ttft_mean_s": statistics.fmean(ttfts) if ttfts else float("nan"),
        "tpot_p50_s": _quantile(tpots, 0.5),
        "tpot_p95_s": _quantile(tpots, 0.95),
        "redis_tokens": sum(r["sources"].get("redis", 0) for r in rows),
        # How evenly the routing spread the turns: the busiest worker's share of them.
        "busiest_worker_share": max(workers.values()) / max(1, len(rows)) if workers else float("nan"),
    }


def _quantile(ordered: list[float], q: float) -> float:
    """The nearest-rank quantile of sorted values (nan for none)."""
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")
