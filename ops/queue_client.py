"""Talk to the running service straight through Redis and Celery: submit, ping, stats."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from broker import keys, priority
from broker.celery_app import make_celery
from broker.codec import encode_job
from broker.errors import KvferryError
from broker.jobs import events as job_events
from broker.messages import (
    ChatMessage,
    GenerateJob,
    GenerateResult,
    JobDone,
    JobFailed,
    TokenDelta,
    WorkerStatus,
)
from broker.redis.connect import connect
from broker.sampling import SamplingParams
from broker.worker_registry import live_workers, queue_depths
from ops.settings import Settings


class JobFailedError(KvferryError):
    def __init__(self, failed: JobFailed) -> None:
        super().__init__(f"{failed.error_type} ({failed.status_code}): {failed.message}")
        self.failed = failed


def submit_and_follow(
    settings: Settings,
    prompt: str,
    *,
    chat: bool,
    system: str | None,
    max_tokens: int,
    temperature: float,
    session_id: str | None,
    queue: str | None,
    model: str,
    out: TextIO | None = None,
) -> GenerateResult:
    messages = ((ChatMessage("system", system),) if system else ()) + (ChatMessage("user", prompt),)
    job = GenerateJob(
        model=model,
        endpoint="chat" if chat else "completion",
        messages=messages if chat else (),
        prompt=None if chat else prompt,
        params=SamplingParams(max_tokens=max_tokens, temperature=temperature),
        session_id=session_id,
        submitted_at=time.time(),
    )
    app = make_celery(settings.broker_config())
    client = connect(settings.queue_url)
    job_id = str(uuid.uuid4())
    app.send_task(
        keys.GENERATE_TASK,
        args=[encode_job(job)],
        task_id=job_id,
        queue=queue or keys.SHARED_QUEUE,
        priority=priority.job_band(job),
    )
    for event in job_events.follow(client, job_id, timeout_s=settings.job_time_limit_s):
        if isinstance(event, TokenDelta) and out is not None:
            out.write(event.text)
            out.flush()
        elif isinstance(event, JobDone):
            return event.result
        elif isinstance(event, JobFailed):
            raise JobFailedError(event)
    raise TimeoutError(job_id)


@dataclass(frozen=True, slots=True)
class PingReport:
    workers: list[WorkerStatus]
    answered: set[str]  # workers that answered a Celery ping
    depths: dict[str, int]

    def render(self) -> str:
        lines = [f"queue {name}: {depth} waiting" for name, depth in self.depths.items()]
        if not self.workers:
            lines.append("no live workers")
        for w in self.workers:
            alive = "pong" if w.name in self.answered else "no pong"
            e = w.engine
            figures = (
                f"running {e.num_running} waiting {e.num_waiting} kv {e.kv_usage:.0%} "
                f"({e.pool_blocks_used}/{e.pool_blocks_total} blocks, {e.pool_blocks_cached} cached) "
                f"hit rate {e.prefix_hit_rate:.0%}"
                if e is not None
                else "engine loading"
            )
            lines.append(
                f"{w.name} [{alive}] model={w.model} jobs={w.jobs_running} {figures} "
                f"beat {time.time() - w.sent_at:.1f}s ago"
            )
        return "\n".join(lines)


def ping(settings: Settings, timeout: float) -> PingReport:
    client = connect(settings.queue_url)
    workers = live_workers(client)
    replies = make_celery(settings.broker_config()).control.ping(timeout=timeout) or []
    answered = {name for reply in replies for name in reply}
    return PingReport(workers, answered, queue_depths(client, workers))


def worker_stats(settings: Settings) -> list[dict[str, Any]]:
    rows = []
    for w in live_workers(connect(settings.queue_url)):
        row: dict[str, Any] = {
            "worker": w.name,
            "model": w.model,
            "jobs_done": w.jobs_done,
            "jobs_failed": w.jobs_failed,
        }
        e = w.engine
        if e is not None:
            per = e.bytes_per_block
            free_blocks = e.pool_blocks_total - e.pool_blocks_used - e.pool_blocks_cached
            row.update(
                weights_bytes=e.weights_bytes,
                pool_bytes=e.pool_bytes,
                used_bytes=e.pool_blocks_used * per,
                cached_bytes=e.pool_blocks_cached * per,
                free_bytes=free_blocks * per,
                prefix_cache_queries_tokens=e.prefix_cache_queries_tokens,
                prefix_cache_hits_tokens=e.prefix_cache_hits_tokens,
                prefix_hit_rate=round(e.prefix_hit_rate, 4),
                fragmentation=round(e.fragmentation, 4),
                steps=e.num_steps,
                max_batch_seqs=e.max_batch_seqs,
            )
        rows.append(row)
    return rows


def redis_tier_report(settings: Settings) -> dict[str, Any]:
    """The KV tier as every worker left it (kvstore/redis/report.py): counters, pins per tenant,
    orphan pins (must be 0)."""
    from kvstore.redis.client import kv_client
    from kvstore.redis.report import read_report

    queue_client = connect(settings.queue_url)
    kv = kv_client(settings.kv_redis_url) if settings.kv_redis_url else queue_client
    return read_report(kv, queue_client)


def preload(settings: Settings, path: Path, out: TextIO, tenant: str = "") -> int:
    """Compute and pin prompt templates (JSONL: {"messages": [...]} or {"prompt": "..."}; a plain
    text line is a system prompt) so their blocks stay in the Redis tier for every worker."""
    app = make_celery(settings.broker_config())
    client = connect(settings.queue_url)
    handles = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            doc: dict[str, Any] = (
                json.loads(line)
                if line.lstrip().startswith("{")
                else {"messages": [{"role": "system", "content": line}]}
            )
        except json.JSONDecodeError as exc:
            raise KvferryError(f"{path}:{n}: not JSON: {exc}") from exc
        messages = tuple(ChatMessage(m["role"], m["content"]) for m in doc.get("messages", ()))
        job = GenerateJob(
            model=doc.get("model", settings.served_model),
            endpoint="chat" if messages else "completion",
            messages=messages,
            prompt=doc.get("prompt"),
            params=SamplingParams(max_tokens=1),
            pin_prefix=True,
            tenant=tenant,
            submitted_at=time.time(),
        )
        job_id = str(uuid.uuid4())
        band = priority.job_band(job)
        app.send_task(
            keys.GENERATE_TASK, args=[encode_job(job)], task_id=job_id, queue=keys.SHARED_QUEUE, priority=band
        )
        handles.append((n, job_id))
    for n, job_id in handles:
        for event in job_events.follow(client, job_id, timeout_s=settings.job_time_limit_s):
            if isinstance(event, JobDone):
                u = event.result.usage
                out.write(
                    f"line {n}: {u.prompt_tokens} prompt tokens pinned ({u.cached_tokens} were cached)\n"
                )
            elif isinstance(event, JobFailed):
                out.write(f"line {n}: failed: {event.message}\n")
    return len(handles)
