"""A cached prompt through the API right after a long turn, against a cold one and against the
engine's own cached TTFT (part of `kvferry bench tiers`).

One worker. A long turn (a ~1,300-token prompt generating some tokens) finishes, and its
write-through to the Redis tier starts; at once a ~1,300-token prompt sharing its prefix is sent
(cached), and, with the worker idle, a ~1,300-token prompt of unrelated tokens (cold). TTFT is the
first streamed token, seen by the client. The engine alone (LLMEngine in this process, same
threads) answers the same cached case right after each API one, with the worker idle: what the
service path adds is api cached / engine cached, pair by pair (ops/bench/paired.py).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from broker.sampling import SamplingParams
from ops.bench.paired import Pairs
from ops.redis.server import free_port
from ops.settings import Settings
from ops.stack.stack import Stack
from workers.engine.factory import build_engine
from workers.engine.llm_engine import LLMEngine
from workers.engine.model.loader import load_model

PREFIX_TOKENS = 1280  # shared by the long turn and the cached prompt: 80 blocks of 16
TAIL_TOKENS = 24  # each prompt's own end: ~1,300 tokens in all
LONG_TURN_OUTPUT = 32


def _tokens(rng: torch.Generator, vocab: int, n: int) -> list[int]:
    return torch.randint(100, vocab, (n,), generator=rng).tolist()


def _stream_ttft(client: httpx.Client, model: str, prompt: list[int], max_tokens: int) -> tuple[float, int]:
    """Seconds to the first streamed token, and the prompt tokens the KV cache served."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    ttft, cached = float("nan"), 0
    with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if ttft != ttft and chunk.get("choices") and chunk["choices"][0].get("text"):
                ttft = time.perf_counter() - started
            usage = chunk.get("usage") or {}
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", cached)
    return ttft, cached


def _cases(vocab: int, reps: int, seed: int) -> list[tuple[list[int], list[int], list[int]]]:
    """Per repetition: (long turn, cached prompt sharing its prefix, cold prompt)."""
    rng = torch.Generator().manual_seed(seed)
    cases = []
    for _ in range(reps):
        prefix = _tokens(rng, vocab, PREFIX_TOKENS)
        long_turn = prefix + _tokens(rng, vocab, TAIL_TOKENS)
        cached = prefix + _tokens(rng, vocab, TAIL_TOKENS)
        cold = _tokens(rng, vocab, PREFIX_TOKENS + TAIL_TOKENS)
        cases.append((long_turn, cached, cold))
    return cases


def _engine_cached_ttft(engine: LLMEngine, long_turn: list[int], cached: list[int]) -> float:
    engine.generate([long_turn], SamplingParams(max_tokens=LONG_TURN_OUTPUT, ignore_eos=True))
    started = time.perf_counter()
    engine.generate([cached], SamplingParams(max_tokens=1, ignore_eos=True))
    return time.perf_counter() - started


def bench_api_ttft(settings: Settings, run_dir: Path, reps: int = 2) -> dict[str, Any]:
    threads = settings.torch_threads or max(1, os.cpu_count() or 1)  # what a lone worker gets
    settings = settings.with_overrides(api_port=free_port(), torch_threads=threads)
    loaded = load_model(settings.model, settings.dtype, settings.device, settings.cache_dir)
    cases = _cases(int(loaded.model.config.vocab_size), reps, seed=11)
    engine = build_engine(settings.engine_config(), loaded)
    engine.generate([[7, 8, 9]], SamplingParams(max_tokens=1))  # first-forward warm-up
    cached_s, cold_s, hits, engine_s = [], [], [], []
    with Stack(settings, 1, run_dir=run_dir, with_flower=False) as stack:
        stack.wait_ready()
        with httpx.Client(base_url=stack.api_url, timeout=600) as client:
            model = settings.served_model
            _stream_ttft(client, model, [7, 8, 9], 2)  # the worker's first forward, untimed
            for long_turn, cached, cold in cases:
                torch.set_num_threads(1)  # the bench process is only a client now
                time.sleep(1.0)  # idle: the previous write-through is done
                cold_s.append(_stream_ttft(client, model, cold, 2)[0])
                time.sleep(1.0)
                _stream_ttft(client, model, long_turn, LONG_TURN_OUTPUT)
                ttft, hit = _stream_ttft(client, model, cached, 2)  # at once: writes in flight
                cached_s.append(ttft)
                hits.append(hit)
                # its pair: the engine alone, right after, with the worker idle and its threads
                time.sleep(1.0)
                torch.set_num_threads(threads)
                engine_s.append(_engine_cached_ttft(engine, long_turn, cached))
    return figures(settings, reps, engine_s, cached_s, cold_s, hits)


def figures(
    settings: Settings,
    reps: int,
    engine_s: list[float],
    cached_s: list[float],
    cold_s: list[float],
    hits: list[int],
) -> dict[str, Any]:
    """bench_api_ttft's report from its TTFTs (seconds); engine_s[i] was timed right after
    cached_s[i], its pair."""
    api_cached, api_cold = statistics.median(cached_s), statistics.median(cold_s)
    vs_engine = Pairs.of(cached_s, engine_s)
    return {
        "prompt_tokens": PREFIX_TOKENS + TAIL_TOKENS,
        "cached_prefix_tokens": PREFIX_TOKENS,
        "reps": reps,
        "api_cached_ttft_s": api_cached,
        "api_cold_ttft_s": api_cold,
        "engine_cached_ttft_s": vs_engine.baseline_median,
        "api_cached_ttft_ratio": api_cached / api_cold,
        "api_vs_engine_cached": vs_engine.ratio,
        "api_vs_engine_cached_pairs": vs_engine.table(),
        "api_cached_ttfts_s": cached_s,
        "api_cold_ttfts_s": cold_s,
        "api_cached_hit_tokens": hits,
        "redis_tier": settings.redis_tier_on,
    }
