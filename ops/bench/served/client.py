"""The served side of `kvferry bench served-decode`: vLLM `bench serve`'s random workload over
/v1/completions (random token-id prompts, a fixed output length with ignore_eos, a fixed number
of requests at a maximum concurrency), and its figures: per request TPOT = (latency - TTFT) /
(output tokens - 1), median over requests."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass
from typing import Any

import httpx
from rich.progress import Progress

TOKEN_RANGE = (1000, 30000)  # plain vocabulary ids: no special token lands in a random prompt


@dataclass(frozen=True, slots=True)
class Served:
    ttft_s: float
    latency_s: float
    output_tokens: int
    error: str = ""

    @property
    def tpot_s(self) -> float | None:
        if self.error or self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


def random_prompts(count: int, input_len: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(*TOKEN_RANGE) for _ in range(input_len)] for _ in range(count)]


async def _one(client: httpx.AsyncClient, model: str, prompt: list[int], output_len: int) -> Served:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    ttft = float("nan")
    tokens = 0
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                return Served(ttft, time.perf_counter() - started, 0, f"{response.status_code}: {text[:200]}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices") and ttft != ttft:
                    ttft = time.perf_counter() - started
                if chunk.get("usage"):
                    tokens = int(chunk["usage"].get("completion_tokens", 0))
    except httpx.HTTPError as exc:
        return Served(ttft, time.perf_counter() - started, 0, str(exc))
    return Served(ttft, time.perf_counter() - started, tokens)


async def _load(
    base_url: str, model: str, prompts: list[list[int]], output_len: int, concurrency: int, label: str
) -> tuple[list[Served], float]:
    done: list[Served] = []
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as client:
        with Progress(transient=True) as bar:
            task = bar.add_task(label, total=len(prompts))

            async def one(prompt: list[int]) -> None:
                async with gate:
                    done.append(await _one(client, model, prompt, output_len))
                bar.advance(task)

            started = time.perf_counter()
            await asyncio.gather(*(one(p) for p in prompts))
            wall = time.perf_counter() - started
    return done, wall


def run_load(
    base_url: str, model: str, prompts: list[list[int]], output_len: int, concurrency: int, label: str
) -> tuple[list[Served], float]:
    """Every prompt once, at most `concurrency` in flight; the records and the wall seconds."""
    return asyncio.run(_load(base_url, model, prompts, output_len, concurrency, label))


def served_figures(records: list[Served], wall_s: float) -> dict[str, Any]:
    ok = [r for r in records if not r.error]
    tpots = [t for r in ok if (t := r.tpot_s) is not None]
    return {
        "requests": len(records),
        "errors": len(records) - len(ok),
        "served_tpot_median_s": statistics.median(tpots) if tpots else None,
        "ttft_median_s": statistics.median(r.ttft_s for r in ok) if ok else None,
        "output_tok_s": sum(r.output_tokens for r in ok) / wall_s if wall_s > 0 else None,
        "wall_s": wall_s,
    }
