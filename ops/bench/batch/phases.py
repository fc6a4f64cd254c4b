"""The three measurements of `kvferry bench batch` (ops/bench/batch/run.py runs them on one stack):

- throughput: a batch's output tok/s against the same requests sent online, at the best of a few
  concurrencies. The concurrency scan runs first (it warms the stack for both), then the batch,
  then the online run; the online requests carry a cache salt of their own (the scan's another),
  so neither side finds the other's prompts in the pool: each computes all of its prompts and
  shares only its own system prompt's blocks;
- ttft: interactive streaming requests, one at a time, on an idle stack and then while a large
  batch runs (it is cancelled afterwards); the batch's output tok/s (the workers' generated tokens,
  from their heartbeats, less the probes') while the probes run against the same batch alone just
  before and just after them;
- fair: tenant B's single requests (one a second), queue wait (ops/bench/batch/fair_wait.py) alone and
  then while tenant A has hundreds of jobs queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from typing import Any

import openai
import redis
from openai import AsyncOpenAI, OpenAI
from tqdm import tqdm

from api.stage_clock import REQUEST_HEADER
from broker.worker_registry import live_workers
from ops.bench.batch import client as bc
from ops.bench.batch.fair_wait import FairWait
from ops.bench.queue.stages import FIRST_TOKEN_STAGES, stamps, summarize

PROBE_TOKENS = 8  # each interactive probe's max_tokens
LINGER_S = 1.5  # past the engine's batch sizing after the last interactive request (batch_budget.py)


async def _online(
    base_url: str, key: str, bodies: list[dict[str, Any]], concurrency: int
) -> tuple[int, float]:
    """Send every body as a chat completion, `concurrency` at a time: (output tokens, seconds)."""
    client = AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=600)
    todo = list(bodies)
    tokens = 0
    bar = tqdm(total=len(bodies), desc=f"online x{concurrency}", unit="req", leave=False)

    async def one() -> None:
        nonlocal tokens
        while todo:
            body = todo.pop()
            reply = await client.chat.completions.create(**bc.client_kwargs(body))
            tokens += reply.usage.completion_tokens if reply.usage else 0
            bar.update(1)

    started = time.perf_counter()
    try:
        await asyncio.gather(*(one() for _ in range(concurrency)))
    finally:
        bar.close()
        await client.close()
    return tokens, time.perf_counter() - started


def throughput(
    client: OpenAI, base_url: str, key: str, model: str, lines: int, max_tokens: int, concurrencies: list[int]
) -> dict[str, Any]:
    bodies = {f"line-{i}": bc.chat_body(model, bc.question("batch", i), max_tokens) for i in range(lines)}
    sample = [{**b, "cache_salt": "scan"} for b in list(bodies.values())[: max(concurrencies) * 2]]
    scan = {}
    for c in concurrencies:  # the best concurrency, on a sample
        tokens, seconds = asyncio.run(_online(base_url, key, sample, c))
        scan[c] = tokens / seconds
    best = max(scan, key=lambda c: scan[c])
    started = time.perf_counter()
    batch = bc.submit(client, bc.jsonl(bodies))
    batch = bc.wait(client, batch.id, 3600, f"batch of {lines}")
    batch_s = time.perf_counter() - started
    output = bc.read_lines(client, batch.output_file_id)
    batch_tokens = bc.completion_tokens(output)
    online = [{**b, "cache_salt": "online"} for b in bodies.values()]
    online_tokens, online_s = asyncio.run(_online(base_url, key, online, best))
    batch_tok_s, online_tok_s = batch_tokens / batch_s, online_tokens / online_s
    return {
        "batch_lines": lines,
        "batch_status": batch.status,
        "batch_lines_completed": len(output),
        "batch_output_tokens": batch_tokens,
        "batch_seconds": batch_s,
        "batch_output_tok_s": batch_tok_s,
        "online_concurrency_scan_tok_s": {str(c): v for c, v in scan.items()},
        "online_best_concurrency": best,
        "online_output_tokens": online_tokens,
        "online_seconds": online_s,
        "online_output_tok_s": online_tok_s,
        "batch_vs_online_throughput": batch_tok_s / online_tok_s,
    }


async def _ttfts(
    base_url: str, key: str, model: str, tag: str, probes: int, gap_s: float, rds: redis.Redis
) -> tuple[list[float], dict[str, dict[str, float]]]:
    """Each probe's TTFT, and where its milliseconds went (queue_stages.FIRST_TOKEN_STAGES)."""
    client = AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120)
    out, runs = [], []
    try:
        for i in tqdm(range(probes), desc=f"interactive TTFT ({tag})", unit="req", leave=False):
            body = bc.chat_body(model, bc.question(tag, i), PROBE_TOKENS)
            sent, started = time.time(), time.perf_counter()
            raw = await client.chat.completions.with_raw_response.create(
                **bc.client_kwargs(body), stream=True, extra_headers={REQUEST_HEADER: "1"}
            )
            first = None
            async for chunk in raw.parse():
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.perf_counter() - started
            ttft = first if first is not None else time.perf_counter() - started
            out.append(ttft)
            runs.append({**stamps(raw.http_response, rds, sent, time.time()), "first_seen": sent + ttft})
            await asyncio.sleep(gap_s)
    finally:
        await client.close()
    return out, summarize(runs, FIRST_TOKEN_STAGES)


def _generated(rds: redis.Redis) -> tuple[int, float]:
    """Tokens the live workers have generated so far (their heartbeats), and when read."""
    return sum(w.engine.generation_tokens for w in live_workers(rds) if w.engine), time.perf_counter()


def ttft(
    client: OpenAI,
    base_url: str,
    redis_url: str,
    key: str,
    model: str,
    flood_lines: int,
    max_tokens: int,
    probes: int,
    alone_s: float = 20.0,
) -> dict[str, Any]:
    rds = redis.Redis.from_url(redis_url, socket_timeout=10)
    idle, idle_stages = asyncio.run(_ttfts(base_url, key, model, "idle", probes, 0.3, rds))
    bodies = {
        f"flood-{i}": bc.chat_body(model, bc.question("flood", i), max_tokens) for i in range(flood_lines)
    }
    batch = bc.submit(client, bc.jsonl(bodies))
    bc.wait_running(client, batch.id, 600, lines=4)
    # The batch alone just before and just after the probes (past the engine's linger), against its
    # rate under them: the two sides of the probes take any drift of the machine's load alike.
    before = _generated(rds)
    time.sleep(alone_s / 2)
    start = _generated(rds)
    busy, busy_stages = asyncio.run(_ttfts(base_url, key, model, "under batch", probes, 0.3, rds))
    end = _generated(rds)
    time.sleep(LINGER_S)
    after = _generated(rds)
    time.sleep(alone_s / 2)
    last = _generated(rds)
    during = client.batches.retrieve(batch.id)
    with contextlib.suppress(openai.ConflictError):  # it ended while probed (a small flood)
        client.batches.cancel(batch.id)
    ended = bc.wait(client, batch.id, 600, "cancelling the flood")
    counts = during.request_counts
    alone_tok_s = (start[0] - before[0] + last[0] - after[0]) / (start[1] - before[1] + last[1] - after[1])
    under_tok_s = (end[0] - start[0] - probes * PROBE_TOKENS) / (end[1] - start[1])
    return {
        "flood_lines": flood_lines,
        "flood_completed_while_probing": counts.completed if counts else None,
        "flood_final_status": ended.status,
        "flood_ran_throughout": during.status == "in_progress",  # else the ratio is not under a batch
        "interactive_ttft_idle_p50_s": statistics.median(idle),
        "interactive_ttft_under_batch_p50_s": statistics.median(busy),
        "interactive_ttft_idle_s": idle,
        "interactive_ttft_under_batch_s": busy,
        "interactive_ttft_ratio_under_batch": statistics.median(busy) / statistics.median(idle),
        "interactive_ttft_stages_idle": idle_stages,
        "interactive_ttft_stages_under_batch": busy_stages,
        "batch_alone_tok_s": alone_tok_s,
        "batch_under_interactive_tok_s": under_tok_s,
        "batch_throughput_under_interactive_ratio": under_tok_s / alone_tok_s,
    }


def fair(
    base_url: str, redis_url: str, key_a: str, key_b: str, model: str, flood_jobs: int, requests: int
) -> dict[str, Any]:
    rds = redis.Redis.from_url(redis_url, socket_timeout=10)
    measured = FairWait(base_url.removesuffix("/v1"), rds, model).measure(key_a, key_b, flood_jobs, requests)
    return {
        "fair_flood_jobs": measured["flood"],
        "fair_b_requests": measured["b_requests"],
        "fair_b_queue_wait_alone_p95_s": measured["b_alone_p95_s"],
        "fair_b_queue_wait_under_flood_p95_s": measured["b_under_flood_p95_s"],
        "fair_wait_ratio": measured["fair_wait_ratio"],
    }
