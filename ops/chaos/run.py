"""`kvferry chaos`: the job path under faults. Starts a stack (or uses a running one), runs a
fault-free reference pass of a seeded workload through it, then runs the same workload again
while SIGKILLing random workers (each restarted under its old name) and restarting the queue's
Redis, and checks every job of the second pass against the first: completed, token-exact, each
token streamed once, none lost. See ops/chaos/check.py for how each figure is counted.

The reference is the same stack before any fault, not an in-process engine: the prompts then go
through the very same API, chat template and tokeniser as the chaos pass, so "exact" compares
like with like, and a session's later turns build on the reference's own earlier answers. As an
engine bug would show in both passes alike, a sample of the chaos pass's jobs is also checked
against HF generate on the exact prompt ids the worker used (ops/chaos/hf.py)."""

from __future__ import annotations

import asyncio
import random
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.redis.connect import connect
from ops.chaos.check import report
from ops.chaos.clients import ChaosClient, JobRecord, LoadConfig, make_scripts, run_load
from ops.chaos.fault_log import FaultLog, stamped
from ops.chaos.faults import FaultInjector, rss_mb
from ops.chaos.hf import hf_check
from ops.chaos.next_turns import drained_sessions, next_turn_figures
from ops.chaos.own_answers import agreement, exact_precision, is_exact_run, own_answers
from ops.chaos.raw_streams import raw_duplicates
from ops.settings import Settings
from ops.stack.stack import Stack

INTEGRITY_COMMAND = "kvferry_integrity"  # workers/process/control.py
KV_SHARDS = 3  # the KV cluster a run with --kv-shard-kills starts
ENGINE_STEP_FAILED = "engine step failed; failing"  # workers/loop/driver.py, once a step


@dataclass(frozen=True, slots=True)
class ChaosConfig:
    workers: int = 2
    clients: int = 16
    kills: int = 20
    redis_restarts: int = 1
    failovers: int = 0  # SIGKILLs of the queue's primary under Sentinel (the stack runs --ha)
    kv_shard_kills: int = 0  # SIGKILLs of a KV shard (the KV tier then runs on a local cluster)
    scale_ins: int = 0  # SIGTERMs of a busy worker (a scale-in: it drains), each started again
    turns: int = 3  # chat turns per session
    words: int = 12  # per user turn
    max_tokens: int = 32
    rounds: int = 2  # distinct scripts per client; the chaos pass cycles over them
    gap_s: tuple[float, float] = (1.0, 4.0)  # between faults
    soak_s: float = 0.0  # > 0: run the load this long, sampling worker RSS
    rss_every_s: float = 5.0
    seed: int = 0
    timeout_s: float = 3600.0  # the whole run's bound
    job_timeout_s: float = 600.0

    @classmethod
    def quick(cls, **overrides: Any) -> ChaosConfig:
        """A small run for the test suite: about a minute with a tiny model."""
        base = cls(
            clients=4, kills=2, turns=2, words=4, max_tokens=8, rounds=1, gap_s=(0.3, 1.0),
            rss_every_s=1.0, timeout_s=240.0, job_timeout_s=60.0,
        )  # fmt: skip
        return _replace(base, overrides)


def _replace(config: ChaosConfig, overrides: dict[str, Any]) -> ChaosConfig:
    from dataclasses import replace

    return replace(config, **{k: v for k, v in overrides.items() if v is not None})


class RssSampler:
    """Each worker's RSS every `every_s`, on a thread: start (first sample), end, max, in MiB."""

    def __init__(self, stack: Stack | None, every_s: float) -> None:
        self.stack = stack
        self.every_s = every_s
        self.samples: dict[str, list[float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvferry-chaos-rss", daemon=True)

    def start(self) -> RssSampler:
        if self.stack is not None:
            self._thread.start()
        return self

    def stop(self) -> dict[str, dict[str, float]]:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        return {
            name: {
                "rss_mb_start": round(s[0], 1),
                "rss_mb_end": round(s[-1], 1),
                "rss_mb_max": round(max(s), 1),
            }
            for name, s in sorted(self.samples.items())
        }

    def _run(self) -> None:
        assert self.stack is not None
        while not self._stop.is_set():
            for name, mb in rss_mb(self.stack).items():
                self.samples.setdefault(name, []).append(mb)
            self._stop.wait(self.every_s)


def integrity(settings: Settings, timeout_s: float = 15.0) -> dict[str, dict[str, Any]]:
    """Every live worker's answer to the pool integrity check (workers/process/control.py)."""

    from broker.celery_app import make_celery
    from broker.worker_registry import live_workers

    app = make_celery(settings.broker_config())
    try:
        expected = len(live_workers(connect(settings.queue_url)))  # answers to wait for
        replies = (
            app.control.broadcast(INTEGRITY_COMMAND, reply=True, timeout=timeout_s, limit=expected or None)
            or []
        )
    except Exception as exc:  # the report says so rather than losing the run's other figures
        return {"(broadcast)": {"ok": False, "error": f"{type(exc).__name__}: {exc}"}}
    return {node: answer for reply in replies for node, answer in reply.items()}


async def _passes(
    api_url: str, settings: Settings, config: ChaosConfig, faults: FaultInjector | None, log: Any
) -> tuple[dict[str, JobRecord], list[JobRecord], float, dict[str, Any]]:
    load = LoadConfig(settings.served_model, config.max_tokens, settings.api_key, config.job_timeout_s)
    client = ChaosClient(api_url, load, config.clients)
    scripts = make_scripts(config.clients, config.rounds, config.turns, config.words, config.seed)
    try:
        log(stamped(f"reference pass: {sum(len(s) for s in scripts)} scripts, no faults"))
        reference = await run_load(client, scripts, lambda: False, 1, "ref")
        references = {r.key: r for r in reference}
        started = time.monotonic()
        soak_end = started + config.soak_s
        hard_end = started + config.timeout_s

        def keep_going() -> bool:
            if time.monotonic() > hard_end:
                return False
            if config.soak_s > 0 and time.monotonic() < soak_end:
                return True
            return faults is not None and not faults.done.is_set()

        if faults is not None:
            faults.start()
        log(stamped(f"chaos pass: the same workload again, {'with' if faults else 'without'} faults"))
        records = await run_load(client, scripts, keep_going, 100_000, "chaos")
        duration = time.monotonic() - started
        moved: dict[str, Any] = {}
        if faults is not None and faults.log.scale_ins:  # after the faults: keep_going waited for them
            drained = drained_sessions(records, faults.log.scale_ins)
            log(stamped(f"next turns of the {len(drained)} session(s) the drained workers served"))
            moved = await next_turn_figures(client, drained, settings.block_size)
        return references, records, duration, moved
    finally:
        await client.close()


def log_sizes(run_dir: Path) -> dict[str, int]:
    """The worker logs' sizes now: a run that reuses --run-dir counts only what it appends."""
    return {log.name: log.stat().st_size for log in run_dir.glob("worker*.log")}


def engine_step_failures(run_dir: Path | None, before: dict[str, int] | None = None) -> int:
    """Steps that failed every request in them (workers/loop/driver.py logs each once):
    their jobs are redelivered and resume exact, yet each is a bug, so the run counts them."""
    if run_dir is None:
        return 0
    found = 0
    for log in run_dir.glob("worker*.log"):
        with log.open("rb") as f:
            f.seek((before or {}).get(log.name, 0))
            found += f.read().decode(errors="replace").count(ENGINE_STEP_FAILED)
    return found


def run_chaos(
    settings: Settings,
    config: ChaosConfig,
    api_url: str | None = None,
    run_dir: Path | None = None,
    log: Any = print,
) -> dict[str, Any]:
    """The whole run; returns the report. With api_url it uses that running stack (no faults)."""
    from ops.redis.server import free_port

    stack: Stack | None = None
    sizes: dict[str, int] = {}
    notes: list[str] = []
    if api_url is None:
        run_dir = run_dir or Path(tempfile.mkdtemp(prefix="kvferry-chaos-"))
        settings = settings.with_overrides(api_port=free_port(), **exact_precision(settings))
        if config.kv_shard_kills:
            settings = settings.with_overrides(kv_shards=settings.kv_shards or KV_SHARDS)
        stack = Stack(settings, config.workers, run_dir=run_dir, with_flower=False, ha=config.failovers > 0)
        sizes = log_sizes(run_dir)
        log(stamped(f"starting {config.workers} worker(s), the api and Redis; logs in {run_dir}"))
    elif config.kills or config.redis_restarts or config.failovers or config.kv_shard_kills:
        notes.append("running stack: this run did not start its workers or Redis, so it kills none")
    try:
        faults = None
        if stack is not None:
            stack.start()
            stack.wait_ready()
            settings, api_url = stack.settings, stack.api_url
            rng = random.Random(config.seed)
            deadline = time.monotonic() + config.timeout_s
            gap = config.gap_s
            faults_planned = config.kills + config.redis_restarts + config.failovers + config.kv_shard_kills
            faults_planned += config.scale_ins
            if config.soak_s > 0 and faults_planned:
                spread = config.soak_s / (faults_planned + 1)
                gap = (0.5 * spread, 1.5 * spread)
            faults = FaultInjector(
                stack,
                config.kills,
                config.redis_restarts,
                rng,
                gap,
                deadline,
                log,
                config.failovers,
                config.kv_shard_kills,
                scale_ins=config.scale_ins,
            )
        assert api_url is not None
        sampler = RssSampler(stack, config.rss_every_s).start()
        references, records, duration, moved = asyncio.run(_passes(api_url, settings, config, faults, log))
        if faults is not None:
            faults.stop()
        log(stamped("load done; checking"))
        rss = sampler.stop()
        checked = integrity(settings)
        extra: dict[str, Any] = {
            "reference_jobs": len(references),
            "reference_completed": sum(r.status == "completed" for r in references.values()),
            "integrity_ok": {node: bool(a.get("ok")) for node, a in checked.items()},
            **moved,
        }
        notes += [
            f"integrity {node}: {a.get('error') or a}" for node, a in checked.items() if not a.get("ok")
        ]
        if stack is not None:
            extra["rss_mb"] = rss
            extra["engine_step_failures"] = engine_step_failures(run_dir, sizes)
        job_ids = [r.job_id for r in records if r.job_id is not None]
        extra.update(raw_duplicates(connect(settings.queue_url, socket_timeout=10), job_ids))
        fault_log = faults.log if faults is not None else FaultLog()
        log(stamped("checking a sample of jobs against HF generate"))
        try:
            extra.update(hf_check(settings, records, fault_log.kills))
        except Exception as exc:  # the verdict fails without it; the run's other figures stay
            extra["hf_error"] = f"{type(exc).__name__}: {exc}"
        fault_log.notes[:0] = notes
        extra["exact_run"] = is_exact_run(settings)
        if extra["exact_run"]:
            return report(records, references, fault_log, duration, extra)
        extra["agree_with_reference"] = agreement(records, references)  # bf16, int8: own_answers.py
        return report(records, own_answers(settings, records), fault_log, duration, extra, by_job=True)
    finally:
        if stack is not None:
            stack.stop()
