"""Where the milliseconds of one queued job go, stage by stage, for `kvferry bench queue`.

Each stage is the time between two stamps (unix seconds, one machine's clock): the client's own
(sent, received), the api's (its X-Kvferry-Stages response header, see api/stage_clock.py) and the
worker's (keys.job_stages, written with the job's final event, its "written" stamp from Redis'
clock). Together the stages add up to the whole request."""

from __future__ import annotations

import statistics
from typing import Any

import httpx
import redis

from api.stage_clock import STAGES_HEADER, parse_header
from broker import keys

# (name, from stamp, to stamp), in the order a job passes them
STAGES: tuple[tuple[str, str, str], ...] = (
    ("api: http in + auth", "sent", "handler"),
    ("api: body + parse", "handler", "parsed"),
    ("api: admit + route", "parsed", "routed"),
    ("api: encode job + Celery message", "routed", "meta"),
    ("job meta + publish (one transaction)", "meta", "published"),
    ("worker pickup (kombu, celery)", "published", "picked"),
    ("worker setup (lease, stream, tokens)", "picked", "leased"),
    ("worker setup (tokenise, submit)", "leased", "submitted"),
    ("engine: to first token", "submitted", "first_token"),
    ("engine: first token to finished", "first_token", "finished"),
    ("result write (final event)", "finished", "written"),
    ("api wake-up", "written", "woken"),
    ("api: settle + body", "woken", "respond"),
    ("api: http out", "respond", "received"),
)

# The stages of a streamed request up to its first token (`first_seen`: the client saw it).
FIRST_TOKEN_STAGES: tuple[tuple[str, str, str], ...] = (
    ("api: in, parse, route, publish", "sent", "published"),
    ("worker pickup (kombu, celery)", "published", "picked"),
    ("worker setup", "picked", "submitted"),
    ("engine: to first token", "submitted", "first_token"),
    ("first token to the client", "first_token", "first_seen"),
)


def pct(values: list[float], q: int) -> float:
    """The q-th percentile (1..99) of `values`, interpolated between samples."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def stamps(response: httpx.Response, client: redis.Redis, sent: float, received: float) -> dict[str, float]:
    """Every stamp of one request: the client's, the api's header and the worker's hash."""
    out = {"sent": sent, "received": received}
    out.update(parse_header(response.headers.get(STAGES_HEADER, "")))
    job_id = response.headers.get("X-Job-Id", "")
    raw: Any = client.hgetall(keys.job_stages(job_id)) if job_id else {}
    out.update({k.decode(): float(v) for k, v in raw.items()})
    return out


def summarize(
    runs: list[dict[str, float]], stages: tuple[tuple[str, str, str], ...] = STAGES
) -> dict[str, dict[str, float]]:
    """{stage: {p50_ms, p99_ms, mean_ms, n}} over the runs that hold both of its stamps."""
    out: dict[str, dict[str, float]] = {}
    for name, start, end in stages:
        ms = [(r[end] - r[start]) * 1000.0 for r in runs if start in r and end in r]
        if ms:
            mean = statistics.fmean(ms)
            out[name] = {"p50_ms": pct(ms, 50), "p99_ms": pct(ms, 99), "mean_ms": mean, "n": len(ms)}
    return out


def table(stages: dict[str, dict[str, float]]) -> str:
    rows = [("stage", "p50 ms", "p99 ms", "mean ms")]
    for name, s in stages.items():
        rows.append((name, f"{s['p50_ms']:.2f}", f"{s['p99_ms']:.2f}", f"{s['mean_ms']:.2f}"))
    total = sum(s["mean_ms"] for s in stages.values())
    rows.append(("sum of means", "", "", f"{total:.2f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
