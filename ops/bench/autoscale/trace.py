"""A seeded bursty arrival trace: a quiet Poisson base with bursts (exponential gaps) of a much
higher rate; each job's seat time from a lognormal number of output tokens x the simulated
engine's time per token (a batched step: a seat's time does not depend on the batch). With
prompt_tokens_median > 0, each job also has a lognormal prompt and takes the KV blocks of its prompt
and output (BLOCK_SIZE tokens a block) in its worker's pool (fleet_model.py: pool_blocks)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

BLOCK_SIZE = 16


@dataclass(frozen=True, slots=True)
class TraceSpec:
    seed: int = 0
    duration_s: float = 900.0
    base_rate: float = 0.4  # jobs/s between bursts
    burst_rate: float = 6.0  # jobs/s in a burst
    burst_s: float = 40.0
    burst_gap_mean_s: float = 180.0
    tokens_median: float = 120.0
    tokens_sigma: float = 0.6
    token_delay_s: float = 0.05
    prompt_tokens_median: float = 0.0  # 0: jobs take no pool room (a pool-free model)


@dataclass(frozen=True, slots=True)
class Job:
    arrival_s: float
    seat_s: float
    blocks: int = 0  # of its worker's KV pool, while it runs


def make_trace(spec: TraceSpec) -> list[Job]:
    rng = random.Random(spec.seed)
    bursts: list[tuple[float, float]] = []
    t = rng.expovariate(1 / spec.burst_gap_mean_s) / 2
    while t < spec.duration_s:
        bursts.append((t, t + spec.burst_s))
        t += spec.burst_s + rng.expovariate(1 / spec.burst_gap_mean_s)
    jobs: list[Job] = []
    t = 0.0
    while True:
        rate = spec.burst_rate if any(a <= t < b for a, b in bursts) else spec.base_rate
        t += rng.expovariate(rate)
        if t >= spec.duration_s:
            return jobs
        tokens = max(1, round(rng.lognormvariate(0, spec.tokens_sigma) * spec.tokens_median))
        blocks = 0
        if spec.prompt_tokens_median > 0:
            prompt = rng.lognormvariate(0, spec.tokens_sigma) * spec.prompt_tokens_median
            blocks = math.ceil((prompt + tokens) / BLOCK_SIZE)
        jobs.append(Job(t, tokens * spec.token_delay_s, blocks))
