"""The fleet of `kvferry bench fleet`: N real Celery worker processes in the simulated-engine mode
(workers/loop/simulated.py: no torch, so dozens fit on one machine), and what Redis says it did."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import redis

from broker import keys
from broker.worker_registry import MAINTENANCE_FIELD, live_workers

ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True, slots=True)
class RedisFigures:
    """INFO's totals: every command Redis ran (scripts' inner commands included), its CPU time."""

    calls: int
    cpu_s: float
    by_command: dict[str, int]

    @classmethod
    def read(cls, client: redis.Redis) -> RedisFigures:
        stats: Any = client.info("commandstats")
        cpu: Any = client.info("cpu")
        by = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
        return cls(sum(by.values()), float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]), by)


@dataclass(frozen=True, slots=True)
class FleetFigures:
    """What the workers' heartbeats say: maintenance time and failures, and who sweeps."""

    workers: int
    maintenance_busy_s: float
    maintenance_cpu_s: float
    maintenance_failures: int
    sweepers: int
    jobs_done: int

    @classmethod
    def read(cls, client: redis.Redis) -> FleetFigures:
        live = live_workers(client)
        pipe = client.pipeline(transaction=False)
        for w in live:
            pipe.hget(keys.worker_heartbeat(w.name), MAINTENANCE_FIELD)
        figures = [json.loads(raw) for raw in pipe.execute() if raw is not None]
        return cls(
            len(live),
            sum(f["busy_s"] for f in figures),
            sum(f["cpu_s"] for f in figures),
            sum(f["failures"] for f in figures),
            sum(1 for f in figures if f["sweeper"]),
            sum(w.jobs_done for w in live),
        )


class Fleet:
    """N worker processes on one Redis, started together and stopped cleanly (SIGTERM: a warm
    shutdown; SIGKILL only for one that outlives the grace)."""

    def __init__(
        self,
        redis_url: str,
        n: int,
        run_dir: Path,
        concurrency: int,
        token_delay_s: float,
        max_tokens: int,
    ) -> None:
        self.redis_url = redis_url
        self.n = n
        self.run_dir = run_dir
        self.concurrency = concurrency
        self.env = {
            **os.environ,
            "KVFERRY_ENGINE": "simulated",
            "KVFERRY_MODEL": "simulated",
            "KVFERRY_REDIS_URL": redis_url,
            "KVFERRY_SIMULATED_TOKEN_DELAY_S": str(token_delay_s),
            "KVFERRY_DEFAULT_MAX_TOKENS": str(max_tokens),
            "KVFERRY_HOST_HEAP_RESERVE": "0",  # no engine: nothing to fault in
            "KVFERRY_REDIS_CACHE_SIZE": "0",
        }
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for i in range(self.n):
            log = (self.run_dir / f"worker-{i}.log").open("wb")
            args = ["worker", "--name", f"fleet{i}", "--concurrency", str(self.concurrency)]
            self.processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", "ops.cli.main", *args, "--loglevel", "WARNING"],
                    cwd=ROOT,
                    env=self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )

    def live(self, client: redis.Redis) -> int:
        dead = [p for p in self.processes if p.poll() is not None]
        if dead:
            log = self.run_dir / f"worker-{self.processes.index(dead[0])}.log"
            raise RuntimeError(f"a fleet worker exited ({dead[0].returncode}): {log.read_text()[-2000:]}")
        return len(live_workers(client))

    def stop(self, grace_s: float = 30.0) -> None:
        for p in self.processes:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in self.processes:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        self.processes = []

    def __enter__(self) -> Fleet:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
