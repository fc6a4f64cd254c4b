"""The realistic routing workload's plan (ops/bench/tiers/realistic.py): seeded, with exponential
think times of mean ~3 s, lognormal reply lengths and varied prompts."""

from __future__ import annotations

import statistics

from ops.bench.tiers.realistic import (
    ARRIVAL_MEAN_S,
    ARRIVAL_MEAN_S_BY_LOAD,
    REPLY_RANGE,
    THINK_MEAN_S,
    pair_order,
    plan,
)


def test_the_plan_is_seeded_and_shaped_like_chat_traffic() -> None:
    sessions = plan(200, 6, seed=3)
    assert sessions == plan(200, 6, seed=3) and sessions != plan(200, 6, seed=4)
    turns = [t for s in sessions for t in s.turns]
    assert all(s.turns[0].think_s == 0 for s in sessions)
    thinks = [t.think_s for s in sessions for t in s.turns[1:]]
    assert abs(statistics.fmean(thinks) - THINK_MEAN_S) < 0.3
    assert statistics.median(thinks) < statistics.fmean(thinks)  # exponential: skewed right
    replies = [t.max_tokens for t in turns]
    assert all(REPLY_RANGE[0] <= n <= REPLY_RANGE[1] for n in replies)
    assert statistics.median(replies) < statistics.fmean(replies)  # lognormal: a long tail
    assert len({len(t.user.split()) for t in turns}) > 30  # varied user messages
    assert len({s.system for s in sessions}) == 4  # system prompts of four lengths, shared
    starts = [s.start_s for s in sessions]
    assert starts == sorted(starts) and starts[-1] > 0


def test_a_slower_load_is_the_same_sessions_arriving_slower() -> None:
    fast, slow = plan(40, 4, seed=5), plan(40, 4, seed=5, arrival_mean_s=3 * ARRIVAL_MEAN_S)
    assert [s.turns for s in fast] == [s.turns for s in slow]
    assert [s.system for s in fast] == [s.system for s in slow]
    assert all(abs(b.start_s - 3 * a.start_s) < 1e-9 for a, b in zip(fast, slow, strict=True))
    assert ARRIVAL_MEAN_S_BY_LOAD["overload"] == ARRIVAL_MEAN_S < ARRIVAL_MEAN_S_BY_LOAD["moderate"]


def test_pairs_alternate_which_routing_runs_first() -> None:
    orders = [pair_order(rep) for rep in range(4)]
    assert all(sorted(o) == ["cache-aware", "round-robin"] for o in orders)
    assert [o[0] for o in orders] == ["cache-aware", "round-robin", "cache-aware", "round-robin"]
