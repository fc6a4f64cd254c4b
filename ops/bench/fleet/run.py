"""`kvferry bench fleet`: what a job costs Redis as the fleet grows, at N = 2, 8, 32, 64 workers.

For each N: a fresh queue redis-server, N real Celery worker processes in the simulated-engine
mode (the real job path: Celery task, leases, fenced stream, sessions, heartbeats, maintenance;
workers/loop/simulated.py in place of the model), a quiet spell (the idle fleet's own cost), then
a burst of jobs per worker (capped) submitted as the api does (api/routing/router.py's choose_queue, then
api/jobs/client.py's submit transaction), each a new session's chat turn. The window runs from
the first submit to the last job's end; everything Redis ran in it counts, the idle fleet's
heartbeats and maintenance included, but for the bench's own polling for the ends (subtracted).

Per N: redis_cmds_per_job (INFO commandstats, scripts' inner commands included),
redis_cpu_ms_per_1000_jobs (INFO cpu), maintenance_ms_per_worker_s (the workers' own clocks,
published with their heartbeats), idle_redis_cmds_per_worker_s, sweepers (must be 1). Then the
router's decision p99 at 64 workers with 50,000 digests each (ops/bench/fleet/route.py), and
redis_cmds_per_job_ratio_<max>_vs_<min>. docs/benchmarks.md has the figures.
"""

from __future__ import annotations

import asyncio
import platform
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from tqdm import tqdm

from api.jobs.client import JobClient
from api.jobs.meta import JobMeta
from api.routing.memory import RoutingMemory
from api.routing.router import choose_queue
from broker import keys
from broker.celery_app import BrokerConfig
from broker.codec import decode_event
from broker.jobs.events import EVENT_FIELD
from broker.messages import ChatMessage, GenerateJob, JobDone
from broker.sampling import SamplingParams
from ops.bench.fleet.route import route_p99_ms
from ops.bench.fleet.workers import Fleet, FleetFigures, RedisFigures
from ops.redis.server import RedisServer

MODEL = "simulated"
SYSTEM = ChatMessage("system", "You are the fleet benchmark's assistant.")
POLL_S = 0.25


async def _submit_all(url: str, jobs: int, max_tokens: int) -> list[str]:
    """Route and queue `jobs` chat turns as the api does; returns their ids."""
    client = JobClient(BrokerConfig(redis_url=url), job_ttl_s=3600)
    memory = RoutingMemory()  # the api's (api/context.py)
    ids = []
    try:
        for i in range(jobs):
            job = GenerateJob(
                MODEL,
                endpoint="chat",
                messages=(SYSTEM, ChatMessage("user", f"question {i}")),
                params=SamplingParams(max_tokens=max_tokens, temperature=0.0),
                session_id=f"fleet-{uuid.uuid4().hex[:12]}",
                submitted_at=time.time(),
            )
            route = await choose_queue(
                client.redis, job, "cache-aware", 8, prefetch_hints=True, cache=client.fleet, memory=memory
            )
            meta = JobMeta(
                str(uuid.uuid4()),
                "/v1/chat/completions",
                MODEL,
                route.queue,
                route.reason,
                job.submitted_at or time.time(),
                session_id=job.session_id,
                params=job.params,
            )
            await client.submit(meta, job)
            ids.append(meta.job_id)
    finally:
        await client.close()
    return ids


def _wait_ended(client: redis.Redis, ids: list[str], timeout_s: float, n: int) -> int:
    """Wait for every job's end (EXISTS of its end stream); returns the commands this sent."""
    left, sent = list(ids), 0
    deadline = time.monotonic() + timeout_s
    with tqdm(total=len(ids), desc=f"{n} workers: jobs", unit="job", leave=False) as bar:
        while left:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(left)} of {len(ids)} jobs did not end within {timeout_s:.0f}s")
            pipe = client.pipeline(transaction=False)
            for job_id in left:
                pipe.exists(keys.job_end(job_id))
            ended = pipe.execute()
            sent += len(left)  # a pipeline without a transaction: the EXISTS alone
            now_left = [j for j, e in zip(left, ended, strict=True) if not e]
            bar.update(len(left) - len(now_left))
            left = now_left
            if left:
                time.sleep(POLL_S)
    return sent


def _completed(client: redis.Redis, ids: list[str], max_tokens: int) -> int:
    """How many jobs ended done with all their tokens (read after the window)."""
    pipe = client.pipeline(transaction=False)
    for job_id in ids:
        pipe.xrange(keys.job_end(job_id), count=1)
    ok = 0
    for entries in pipe.execute():
        event = decode_event(entries[0][1][EVENT_FIELD]) if entries else None
        ok += isinstance(event, JobDone) and event.result.usage.completion_tokens == max_tokens
    return ok


def _wait_live(fleet: Fleet, client: redis.Redis, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    with tqdm(total=fleet.n, desc=f"{fleet.n} workers: starting", unit="worker", leave=False) as bar:
        while (live := fleet.live(client)) < fleet.n:
            bar.update(live - bar.n)
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {live} of {fleet.n} workers came up in {timeout_s:.0f}s")
            time.sleep(0.5)
        bar.update(fleet.n - bar.n)


def run_one(n: int, opts: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    jobs = min(opts["jobs_per_worker"] * n, opts["max_jobs"])
    with RedisServer(run_dir / f"redis-{n}") as server:
        client = redis.Redis.from_url(server.url)
        fleet = Fleet(
            server.url,
            n,
            run_dir / f"fleet-{n}",
            opts["concurrency"],
            opts["token_delay_s"],
            opts["max_tokens"],
        )
        with fleet:
            _wait_live(fleet, client)
            time.sleep(2.0)  # every worker past its start-up work (release_own, first beats)
            idle_start, idle_t0 = RedisFigures.read(client), time.monotonic()
            time.sleep(opts["idle_s"])
            idle_end, idle_s = RedisFigures.read(client), time.monotonic() - idle_t0
            fleet_start = FleetFigures.read(client)
            start, t0 = RedisFigures.read(client), time.monotonic()
            ids = asyncio.run(_submit_all(server.url, jobs, opts["max_tokens"]))
            submitted_s = time.monotonic() - t0
            polled = _wait_ended(client, ids, opts["timeout_s"], n)
            window = time.monotonic() - t0
            end = RedisFigures.read(client)
            completed = _completed(client, ids, opts["max_tokens"])
            time.sleep(1.0)  # the next heartbeat carries each worker's last maintenance figures
            fleet_end = FleetFigures.read(client)
            window_with_beat = time.monotonic() - t0
        client.close()
    calls = end.calls - start.calls - polled - 2  # the bench's own polling and start's two INFOs
    maintenance_s = fleet_end.maintenance_busy_s - fleet_start.maintenance_busy_s
    maintenance_cpu_s = fleet_end.maintenance_cpu_s - fleet_start.maintenance_cpu_s
    worker_s = n * window_with_beat
    return {
        "workers": n,
        "jobs": jobs,
        "jobs_completed": completed,  # done, with every token
        "window_s": round(window, 3),
        "submit_s": round(submitted_s, 3),
        "jobs_per_s": round(jobs / window, 2),
        "redis_cmds_per_job": round(calls / jobs, 2),
        "redis_cpu_ms_per_1000_jobs": round((end.cpu_s - start.cpu_s) * 1e6 / jobs, 1),
        # the maintenance threads' CPU time; their wall time also counts the waits for a core and
        # the GIL, which an overloaded machine (64 workers on 2 cores) stretches
        "maintenance_ms_per_worker_s": round(maintenance_cpu_s * 1000 / worker_s, 3),
        "maintenance_wall_ms_per_worker_s": round(maintenance_s * 1000 / worker_s, 3),
        "idle_redis_cmds_per_worker_s": round((idle_end.calls - idle_start.calls - 2) / (n * idle_s), 2),
        "sweepers": fleet_end.sweepers,
        "maintenance_failures": fleet_end.maintenance_failures,
        "top_commands_per_job": {
            c: round((end.by_command.get(c, 0) - start.by_command.get(c, 0)) / jobs, 2)
            for c in sorted(end.by_command, key=lambda c: start.by_command.get(c, 0) - end.by_command[c])[:8]
        },
    }


def run_fleet_bench(
    workers_list: list[int],
    jobs_per_worker: int = 20,
    max_jobs: int = 1280,
    concurrency: int = 4,
    token_delay_s: float = 0.02,
    max_tokens: int = 16,
    idle_s: float = 5.0,
    route_workers: int = 64,
    route_digests: int = 50_000,
    timeout_s: float = 600.0,
) -> dict[str, Any]:
    opts = dict(locals())
    results: dict[str, Any] = {
        "cpu": platform.processor() or platform.machine(),
        "settings": opts,
        "fleets": [],
    }
    with tempfile.TemporaryDirectory(prefix="kvferry-fleet-") as tmp:
        for n in workers_list:
            row = run_one(n, opts, Path(tmp))
            results["fleets"].append(row)
            print(
                f"{n:3d} workers: {row['redis_cmds_per_job']:7.2f} cmds/job  "
                f"{row['redis_cpu_ms_per_1000_jobs']:8.1f} Redis cpu ms/1000 jobs  "
                f"{row['maintenance_ms_per_worker_s']:6.3f} maintenance ms/worker-s "
                f"({row['maintenance_wall_ms_per_worker_s']:.3f} wall)  "
                f"{row['jobs_per_s']:7.1f} jobs/s  sweepers {row['sweepers']}",
                flush=True,
            )
        with RedisServer(Path(tmp) / "redis-route") as server:
            results.update(route_p99_ms(server.url, route_workers, route_digests))
    rows = results["fleets"]
    lo, hi = rows[0], rows[-1]
    ratio = hi["redis_cmds_per_job"] / lo["redis_cmds_per_job"]
    results[f"redis_cmds_per_job_ratio_{hi['workers']}_vs_{lo['workers']}"] = round(ratio, 3)
    results["maintenance_ms_per_worker_s_max"] = max(r["maintenance_ms_per_worker_s"] for r in rows)
    print(
        f"redis cmds/job {hi['workers']} vs {lo['workers']} workers: {ratio:.3f}x; route p99 "
        f"{results['route_p99_ms']:.2f} ms at {route_workers} workers x {route_digests} digests",
        flush=True,
    )
    return results
