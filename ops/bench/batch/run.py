"""`kvferry bench batch`: the Batch API over the queue against the same work sent online, an
interactive request's TTFT while a batch runs, and one tenant's wait while another floods the
queue. One stack (two Redis, N workers, the api; two tenants with equal weights), three phases
(ops/bench/batch/phases.py), every figure a ratio within this run. docs/benchmarks.md has the
figures and the commands."""

from __future__ import annotations

import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from openai import OpenAI

from ops.bench.batch import phases as batch_phases
from ops.redis.server import free_port
from ops.settings import Settings
from ops.stack.stack import Stack

KEY_A, KEY_B = "bench-batch-a", "bench-batch-b"  # tenants A and B of the stack it starts
PHASES = ("throughput", "ttft", "fair")


def run_batch_bench(
    settings: Settings,
    workers: int = 2,
    lines: int = 512,
    flood_lines: int = 2000,
    max_tokens: int = 32,
    probes: int = 40,
    alone_s: float = 20.0,
    fair_jobs: int = 500,
    fair_requests: int = 20,
    concurrencies: tuple[int, ...] = (16, 32, 64),
    skip: frozenset[str] = frozenset(),
    run_dir: Path | None = None,
    log: Callable[[str], object] = print,
) -> dict[str, Any]:
    run_dir = run_dir or Path(tempfile.mkdtemp(prefix="kvferry-bench-batch-"))
    settings = settings.with_overrides(
        api_port=free_port(), api_keys=f"{KEY_A}:tenant-a,{KEY_B}:tenant-b", api_key=None
    )
    out: dict[str, Any] = {
        "machine": platform.processor() or platform.machine(),
        "workers": workers,
        "model": settings.served_model,
        "max_tokens": max_tokens,
    }
    log(f"starting {workers} worker(s), the api and Redis; logs in {run_dir}")
    with Stack(settings, workers, run_dir=run_dir, with_flower=False) as stack:
        stack.wait_ready()
        base = f"{stack.api_url}/v1"
        client = OpenAI(base_url=base, api_key=KEY_A, max_retries=0, timeout=600)
        model = stack.settings.served_model
        started = time.perf_counter()
        if "throughput" not in skip:
            log(f"throughput: a batch of {lines} lines, then the same requests online")
            out.update(
                batch_phases.throughput(client, base, KEY_A, model, lines, max_tokens, list(concurrencies))
            )
        if "ttft" not in skip:
            log(f"ttft: {probes} interactive requests idle, then under a batch of {flood_lines}")
            out.update(
                batch_phases.ttft(
                    client,
                    base,
                    stack.settings.queue_url,
                    KEY_B,
                    model,
                    flood_lines,
                    max_tokens,
                    probes,
                    alone_s,
                )
            )
        if "fair" not in skip:
            log(f"fair: tenant B one a second, alone and while tenant A has {fair_jobs} jobs queued")
            out.update(
                batch_phases.fair(
                    base, stack.settings.queue_url, KEY_A, KEY_B, model, fair_jobs, fair_requests
                )
            )
        out["duration_s"] = time.perf_counter() - started
        client.close()
    return out


def render(result: dict[str, Any]) -> str:
    rows = [
        ("batch_vs_online_throughput", ">= 1.0", "batch_output_tok_s", "online_output_tok_s"),
        (
            "interactive_ttft_ratio_under_batch",
            "<= 1.3",
            "interactive_ttft_under_batch_p50_s",
            "interactive_ttft_idle_p50_s",
        ),
        (
            "batch_throughput_under_interactive_ratio",
            "(reported)",
            "batch_under_interactive_tok_s",
            "batch_alone_tok_s",
        ),
        ("fair_wait_ratio", "<= 2.0", "fair_b_queue_wait_under_flood_p95_s", "fair_b_queue_wait_alone_p95_s"),
    ]
    lines = []
    for key, goal, num, den in rows:
        if key in result and result[key] is not None:
            lines.append(
                f"{key:36s} {result[key]:7.3f}  (goal {goal}; {result[num]:.4g} vs {result[den]:.4g})"
            )
    return "\n".join(lines)
