"""`kvferry bench tiers --workload realistic`: routing judged on traffic like a chat service's.

Sessions arrive at seeded exponential gaps; each turn's user message has a lognormal length, its
reply a lognormal length (`ignore_eos`, so the length is the plan's), and a seeded exponential
think time (mean 3 s) passes before the next turn. System prompts of four lengths are shared. Two
workers whose hot pool and warm tier together hold less than the workload's working set (so a
worker cannot keep every session: routing decides who keeps what). The same plan runs with
cache-aware routing, then round-robin, each on a fresh stack (own Redis); the ratios are within
one run: TTFT p50 and p95, and the Redis tier's bytes read per turn (from the tier's counters).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from broker.redis.client import connect
from broker.worker_registry import live_workers
from kvstore.redis.keys import READ_CAUSES
from ops.bench.tiers import pair_stats
from ops.bench.tiers.chat_turn import chat_turn
from ops.bench.tiers.multiturn import figures
from ops.queue_client import redis_tier_report
from ops.redis.server import free_port
from ops.settings import Settings
from ops.stack.stack import Stack

THINK_MEAN_S = 3.0
ARRIVAL_MEAN_S = 0.6  # between sessions' first turns
# The mean gap between sessions' first turns, by load (docs/benchmarks.md, "Routing on a realistic
# workload"): "overload", the pools' bound (both routings' TTFT p95 several seconds), and
# "moderate", the same sessions arriving slower, queues forming now and then but the fleet's wait
# under the autoscaler's target (scale_wait_target_s), as an operator would run it.
ARRIVAL_MEAN_S_BY_LOAD = {"overload": ARRIVAL_MEAN_S, "moderate": 1.2}
REPLY_MEDIAN, REPLY_SIGMA, REPLY_RANGE = 32, 0.7, (4, 192)
USER_MEDIAN_WORDS, USER_SIGMA, USER_RANGE = 18, 0.9, (2, 240)
SYSTEM_REPEATS = (6, 16, 36, 72)  # ~60 to ~600 tokens
_VOCABULARY = (
    "cache queue worker token block session prompt model answer question reason detail example "
    "memory latency system user reply context history server routing tier budget batch step"
)
WORDS = _VOCABULARY.split()  # a user message's words


@dataclass(frozen=True, slots=True)
class Turn:
    user: str
    max_tokens: int
    think_s: float  # before this turn (0 for the first)


@dataclass(frozen=True, slots=True)
class SessionPlan:
    sid: str
    start_s: float
    system: str
    turns: tuple[Turn, ...]


def _lognormal(rng: random.Random, median: float, sigma: float, bounds: tuple[int, int]) -> int:
    return max(bounds[0], min(bounds[1], round(rng.lognormvariate(math.log(median), sigma))))


def plan(
    sessions: int, turns: int, seed: int = 0, arrival_mean_s: float = ARRIVAL_MEAN_S
) -> list[SessionPlan]:
    """The seeded workload: the same for every routing it is run under (and for every arrival
    rate, but for the first turns' times: a gap is the same draw, scaled)."""
    rng = random.Random(seed)
    systems = [
        f"You are assistant number {i}. " + "Answer carefully, briefly and politely. " * n
        for i, n in enumerate(SYSTEM_REPEATS)
    ]
    out, start = [], 0.0
    for i in range(sessions):
        start += rng.expovariate(1 / arrival_mean_s) if i else 0.0
        steps = []
        for t in range(turns):
            words = _lognormal(rng, USER_MEDIAN_WORDS, USER_SIGMA, USER_RANGE)
            user = f"#{i}.{t} " + " ".join(rng.choice(WORDS) for _ in range(words)) + "?"
            reply = _lognormal(rng, REPLY_MEDIAN, REPLY_SIGMA, REPLY_RANGE)
            steps.append(Turn(user, reply, rng.expovariate(1 / THINK_MEAN_S) if t else 0.0))
        out.append(SessionPlan(f"r{seed}-{i}", start, rng.choice(systems), tuple(steps)))
    return out


async def _session(client: httpx.AsyncClient, model: str, p: SessionPlan, rows: list[dict[str, Any]]) -> None:
    await asyncio.sleep(p.start_s)
    messages = [{"role": "system", "content": p.system}]
    for t, step in enumerate(p.turns):
        await asyncio.sleep(step.think_s)
        messages.append({"role": "user", "content": step.user})
        body = {
            "model": model,
            "messages": messages,
            "max_tokens": step.max_tokens,
            "ignore_eos": True,
            "temperature": 0,
            "session_id": p.sid,
        }
        answer = await chat_turn(client, body)
        messages.append({"role": "assistant", "content": answer.text})
        rows.append(answer.row(p.sid, t))


def run_realistic(
    settings: Settings,
    routing: str,
    sessions: list[SessionPlan],
    pool_tokens: int,
    bytes_per_token: int,
    run_dir: Path,
) -> dict[str, Any]:
    """One routing over the plan on a fresh 2-worker stack."""
    stack_settings = settings.with_overrides(
        routing=routing,
        cache_size=str(pool_tokens * bytes_per_token),
        warm_cache_size=str(pool_tokens * bytes_per_token),  # the warm tier as big as the pool
        api_port=free_port(),
        torch_threads=1,
    )
    rows: list[dict[str, Any]] = []
    with Stack(stack_settings, 2, run_dir=run_dir, with_flower=False) as stack:
        stack.wait_ready()

        async def run() -> None:
            async with httpx.AsyncClient(base_url=stack.api_url, timeout=600) as client:
                await asyncio.gather(*(_session(client, settings.served_model, p, rows) for p in sessions))

        started = time.perf_counter()
        asyncio.run(run())
        wall = time.perf_counter() - started
        time.sleep(1.0)  # the last write-throughs land in the counters
        tier = redis_tier_report(stack.settings)
        engines = [w.engine for w in live_workers(connect(stack.settings.queue_url)) if w.engine]
    out = {"routing": routing, "redis_tier": stack_settings.redis_tier_on, "wall_s": wall, **figures(rows)}
    turns = max(1, len(rows))
    out["redis_tier_bytes_read"] = tier["bytes_read"]
    out["redis_tier_bytes_written"] = tier["bytes_written"]
    out["redis_tier_blocks_hit"] = tier["hits"]
    out["redis_tier_blocks_fetched"] = tier["blocks_fetched"]  # packs are read whole: hit or not
    out["redis_tier_bytes_read_by_cause"] = {c: tier[f"bytes_read_{c}"] for c in READ_CAUSES}
    out["redis_tier_bytes_read_per_turn"] = tier["bytes_read"] / turns
    out["redis_tier_bytes_written_per_turn"] = tier["bytes_written"] / turns
    # what the turns' prompts took from Redis (kv_sources), against what was read: the rest was
    # read and not used by the turn that counted it (evicted before use, or a preempted admission)
    out["redis_tier_bytes_used_per_turn"] = out["redis_tokens"] * bytes_per_token / turns
    out["preemptions"] = sum(e.num_preemptions for e in engines)
    # the distinct tokens the sessions' histories hold at their end (shared system prompts once
    # per session: an upper bound of the working set)
    last = {r["sid"]: r["prompt"] + r["completion"] for r in sorted(rows, key=lambda r: r["turn"])}
    out["history_tokens_at_end"] = sum(last.values())
    out["session_moves"] = _moves(rows)
    out["turns_by_worker"] = {
        w: sum(1 for r in rows if r["worker"] == w) for w in sorted({r["worker"] for r in rows})
    }
    out["turn_rows"] = [
        {k: r[k] for k in ("sid", "turn", "worker", "ttft_s", "prompt", "cached")} for r in rows
    ]
    out["ttft_p50_by_turn_s"] = _ttft_p50_by(rows, "turn")
    out["ttft_p50_by_worker_s"] = _ttft_p50_by(rows, "worker")
    # turns whose first token came later than the autoscaling policy's wait target
    target = settings.scale_wait_target_s
    out["ttft_over_wait_target_share"] = sum(r["ttft_s"] > target for r in rows) / turns
    return out


def _ttft_p50_by(rows: list[dict[str, Any]], key: str) -> dict[Any, float]:
    """The median TTFT of the rows of each value of `key` (a turn's index, a worker)."""
    groups: dict[Any, list[float]] = {}
    for r in rows:
        groups.setdefault(r[key], []).append(r["ttft_s"])
    return {k: sorted(v)[len(v) // 2] for k, v in sorted(groups.items())}


def _moves(rows: list[dict[str, Any]]) -> int:
    """Turns served on another worker than their session's previous turn."""
    last: dict[str, str] = {}
    moves = 0
    for r in sorted(rows, key=lambda r: (r["sid"], r["turn"])):
        moves += r["sid"] in last and last[r["sid"]] != r["worker"]
        last[r["sid"]] = r["worker"]
    return moves


def pair_order(rep: int) -> tuple[str, str]:
    """Which routing runs first in pair `rep` (from 0): cache-aware in the even ones."""
    return ("round-robin", "cache-aware") if rep % 2 else ("cache-aware", "round-robin")


def realistic_bench(
    settings: Settings,
    quick: bool,
    bytes_per_token: int,
    run_dir: Path,
    reps: int = 1,
    load: str = "overload",
) -> dict[str, Any]:
    """Cache-aware vs round-robin over one seeded plan; `reps` back-to-back pairs, ratios per pair,
    the headline their median. Odd pairs run round-robin first: a drift of the machine's speed
    within a pair then favours neither routing across the pairs."""
    sessions, turns = (12, 4) if quick else (32, 6)
    # per worker: pool and warm tier hold this many tokens each; the plan's histories add up to
    # several times that (history_tokens_at_end)
    pool_tokens = 1536 if quick else 3072
    steps = plan(sessions, turns, seed=7, arrival_mean_s=ARRIVAL_MEAN_S_BY_LOAD[load])
    pairs = []
    for rep in range(reps):
        runs = {
            routing: run_realistic(
                settings, routing, steps, pool_tokens, bytes_per_token, run_dir / f"{routing}-{rep}"
            )
            for routing in pair_order(rep)
        }
        pairs.append((runs["cache-aware"], runs["round-robin"]))
    out: dict[str, Any] = {
        "load": load,
        "arrival_mean_s": ARRIVAL_MEAN_S_BY_LOAD[load],
        "sessions": sessions,
        "turns": turns,
        "think_mean_s": THINK_MEAN_S,
        "pool_tokens_per_worker": pool_tokens,
        "warm_tokens_per_worker": pool_tokens,
        "bytes_per_token": bytes_per_token,
        "runs": [r for pair in pairs for r in pair],  # cache-aware, round-robin, per pair
    }
    for key, name in (
        ("ttft_p50_s", "ttft_p50_ratio"),
        ("ttft_p95_s", "ttft_p95_ratio"),
        ("redis_tier_bytes_read_per_turn", "redis_tier_bytes_per_turn_ratio"),
        ("tpot_p50_s", "tpot_p50_ratio"),
        ("redis_tier_bytes_used_per_turn", "redis_tier_bytes_used_per_turn_ratio"),
    ):
        ratios = [a[key] / b[key] if b[key] else float("inf") for a, b in pairs]
        out[f"{name}_pairs"] = ratios
        out[name] = pair_stats.median(ratios)
    # how sure the p50 headline is: the pairs' spread, every turn pooled, and turn against turn
    out["ttft_p50_ratio_ci95"] = list(pair_stats.median_interval(out["ttft_p50_ratio_pairs"]))
    out["ttft_p50_ratio_pooled"] = pair_stats.pooled_ratio(pairs)
    out["ttft_matched_gap_p50_s"] = pair_stats.matched_gap_s(pairs)
    return out
