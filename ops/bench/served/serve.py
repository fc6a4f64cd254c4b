"""`kvferry bench serve`: a load generator against the HTTP API. Closed loop: `concurrency` clients,
each sends its next streaming chat request when the last one ends, for `duration` seconds."""

from __future__ import annotations

import asyncio
import csv
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

SYSTEM_PROMPTS = (
    "You are a concise assistant for a bookshop. Answer questions about books, authors and orders in one "
    "or two sentences, politely, without lists.",
    "You are a travel helper. Give short, practical answers about cities, transport and weather, and never "
    "more than two sentences.",
    "You are a maths tutor for children. Explain each answer simply and briefly, with one small example.",
)
QUESTIONS = (
    "What should I read next?",
    "How long does delivery take?",
    "Who wrote Dracula?",
    "Is Lisbon hilly?",
    "How do I get from the airport to the centre?",
    "What is seven times eight?",
    "What is a fraction?",
    "Which season is best for Oslo?",
    "Can I return a book?",
    "What is a prime number?",
)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    started_s: float  # since the run began
    ttft_s: float
    latency_s: float
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    worker: str
    status: int
    error: str


def _percentile(values: list[float], pct: int) -> float:
    """The pct-th percentile, interpolated between samples (never past the largest)."""
    if len(values) < 2:  # statistics.quantiles needs two points
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[pct - 1]


async def _one(
    client: httpx.AsyncClient, model: str, rng: random.Random, max_tokens: int, t0: float, api_key: str
) -> RequestRecord:
    body = {
        "model": model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": max_tokens,
        "temperature": 0,
        "messages": [
            {"role": "system", "content": rng.choice(SYSTEM_PROMPTS)},
            {"role": "user", "content": rng.choice(QUESTIONS)},
        ],
    }
    started = time.perf_counter()
    ttft = float("nan")
    usage: dict[str, Any] = {}
    worker = ""
    try:
        async with client.stream(
            "POST", "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {api_key}"}
        ) as response:
            worker = response.headers.get("x-kvferry-worker", "")
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                return RequestRecord(
                    started - t0,
                    ttft,
                    time.perf_counter() - started,
                    0,
                    0,
                    0,
                    worker,
                    response.status_code,
                    text[:200],
                )
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if (
                    chunk.get("choices")
                    and chunk["choices"][0].get("delta", {}).get("content")
                    and ttft != ttft
                ):
                    ttft = time.perf_counter() - started
                if chunk.get("usage"):
                    usage = chunk["usage"]
                worker = chunk.get("x_kvferry", {}).get("worker", worker)
    except httpx.HTTPError as exc:
        return RequestRecord(started - t0, ttft, time.perf_counter() - started, 0, 0, 0, worker, 0, str(exc))
    return RequestRecord(
        started - t0,
        ttft,
        time.perf_counter() - started,
        usage.get("prompt_tokens", 0),
        usage.get("completion_tokens", 0),
        (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
        worker,
        200,
        "",
    )


async def run_load(
    base_url: str,
    model: str,
    concurrency: int,
    duration_s: float,
    max_tokens: int,
    api_key: str = "bench",
    seed: int = 0,
) -> list[RequestRecord]:
    records: list[RequestRecord] = []
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as client:
        t0 = time.perf_counter()
        bar = tqdm(total=int(duration_s), unit="s", desc=f"load x{concurrency}", leave=False)

        async def client_loop(i: int) -> None:
            rng = random.Random(seed * 1000 + i)
            while time.perf_counter() - t0 < duration_s:
                records.append(await _one(client, model, rng, max_tokens, t0, api_key))
                bar.n = min(int(duration_s), int(time.perf_counter() - t0))
                bar.set_postfix(done=len(records))

        await asyncio.gather(*(client_loop(i) for i in range(concurrency)))
        bar.close()
    return records


def summarize(records: list[RequestRecord], wall_s: float) -> dict[str, Any]:
    ok = [r for r in records if r.status == 200]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    completion = sum(r.completion_tokens for r in ok)
    ttfts = [r.ttft_s for r in ok if r.ttft_s == r.ttft_s]
    return {
        "requests": len(records),
        "errors": len(records) - len(ok),
        "wall_s": wall_s,
        "requests_per_s": len(ok) / wall_s if wall_s else 0.0,
        "output_tokens_per_s": completion / wall_s if wall_s else 0.0,
        "ttft_p50_s": _percentile(ttfts, 50),
        "ttft_p99_s": _percentile(ttfts, 99),
        "latency_p50_s": _percentile([r.latency_s for r in ok], 50),
        "latency_p99_s": _percentile([r.latency_s for r in ok], 99),
        "prefix_hit_rate": cached / prompt if prompt else 0.0,
        "mean_ttft_s": statistics.fmean(ttfts) if ttfts else float("nan"),
        "workers": sorted({r.worker for r in ok if r.worker}),
    }


def write_csv(path: Path, records: list[RequestRecord]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[f.name for f in fields(RequestRecord)])
        writer.writeheader()
        for r in records:
            writer.writerow(asdict(r))


def plot(path: Path, records: list[RequestRecord]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in records if r.status == 200]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.scatter([r.started_s for r in ok], [r.ttft_s * 1000 for r in ok], s=6, label="TTFT")
    a.scatter([r.started_s for r in ok], [r.latency_s * 1000 for r in ok], s=6, label="latency")
    a.set_xlabel("request start (s)")
    a.set_ylabel("ms")
    a.legend()
    a.set_title("per request")
    b.hist([r.ttft_s * 1000 for r in ok if r.ttft_s == r.ttft_s], bins=40)
    b.set_xlabel("TTFT (ms)")
    b.set_title("TTFT distribution")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
