"""The durable accept's cost (api/jobs/submit_write.py): the api's own submission path,
JobClient.submit, against a LocalHA primary with its replica on this machine, with the WAIT for
one replica and without it (the same script, no WAIT), alternating submission by
submission so both see the same machine. Jobs go to a queue nobody consumes.

    kvferry bench durable-accept --submissions 400 --json accept.json  (ops/cli/engine.py)
"""

from __future__ import annotations

import asyncio
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from tqdm import tqdm

from api.jobs.client import JobClient
from api.jobs.meta import JobMeta
from broker.celery_app import BrokerConfig
from broker.messages import GenerateJob
from broker.redis.connect import queue_address
from broker.sampling import SamplingParams
from ops.bench.queue.stages import pct
from ops.redis.ha import LocalHA

VOID = "kvferry.bench.void"
WARMUP = 20


async def _submit_ms(client: JobClient, job: GenerateJob) -> float:
    meta = JobMeta(str(uuid.uuid4()), "/v1/completions", "m", VOID, "bench", time.time())
    start = time.perf_counter()
    await client.submit(meta, job)
    return (time.perf_counter() - start) * 1000


async def _run(address: str, submissions: int) -> dict[str, list[float]]:
    config = BrokerConfig(redis_url=address)
    clients = {
        "with_wait": JobClient(config, job_ttl_s=600, accept_replicas=1, accept_wait_ms=1000),
        "without_wait": JobClient(config, job_ttl_s=600, accept_replicas=0),
    }
    job = GenerateJob(
        model="m", prompt_token_ids=tuple(range(100, 300)), params=SamplingParams(max_tokens=16)
    )
    times: dict[str, list[float]] = {name: [] for name in clients}
    try:
        for client in clients.values():
            for _ in range(WARMUP):
                await _submit_ms(client, job)
        for _ in tqdm(range(submissions), desc="submitting", unit="job"):
            for name, client in clients.items():
                times[name].append(await _submit_ms(client, job))
    finally:
        for client in clients.values():
            await client.close()
    return times


def bench_accept(submissions: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kvferry-accept-") as tmp, LocalHA(Path(tmp)) as ha:
        times = asyncio.run(_run(queue_address(ha.redis_url, ha.sentinels, ha.master), submissions))
    out: dict[str, Any] = {"submissions": submissions}
    for name, ms in times.items():
        out[f"{name}_p50_ms"] = round(pct(ms, 50), 3)
        out[f"{name}_p99_ms"] = round(pct(ms, 99), 3)
    out["p50_ratio"] = round(out["with_wait_p50_ms"] / out["without_wait_p50_ms"], 3)
    return out
