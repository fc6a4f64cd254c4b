"""Start one Celery worker process (threads pool) around one engine."""

from __future__ import annotations

import socket
from pathlib import Path

from celery.signals import worker_shutting_down

from broker import keys
from broker.celery_app import BrokerConfig, make_celery, queue
from workers.engine.config import EngineConfig
from workers.jobs.engine_service import EngineService, TierConfig, WorkerIdentity
from workers.jobs.lease_keeper import LeaseKeeper
from workers.jobs.maintenance import Maintenance
from workers.jobs.reaper import release_own
from workers.jobs.runner import JobRunner
from workers.loop.simulated import SimulatedEngine
from workers.process.bootstep import KVFiguresStep
from workers.process.control import register_control
from workers.process.drain import Drain
from workers.process.heartbeat import Heartbeat
from workers.process.host_heap import keep_freed_memory
from workers.process.status import StatusReader
from workers.process.supervisor import Supervisor
from workers.process.tasks import register_tasks


def node_name(name: str | None) -> str:
    return f"{name or 'worker'}@{socket.gethostname()}"


def run_worker(
    broker: BrokerConfig,
    engine: EngineConfig,
    cache_dir: Path,
    name: str | None = None,
    concurrency: int = 32,
    loglevel: str = "INFO",
    preload: bool = False,
    tiers: TierConfig | None = None,
    kv_redis_url: str | None = None,
    simulated: SimulatedEngine | None = None,
    drain_timeout_s: float = 60.0,
) -> None:
    """Blocks until the worker shuts down. Concurrency = how many jobs share the engine's batch.
    Told to stop (SIGTERM, `kvferry worker --drain`), it drains: workers/process/drain.py."""
    identity = WorkerIdentity(node_name(name))
    # before the model load: the packs a Redis read receives land in faulted-in memory
    keep_freed_memory((tiers or TierConfig()).host_heap_reserve_bytes)
    app = make_celery(broker)
    app.conf.task_queues = [queue(keys.SHARED_QUEUE), queue(identity.queue)]
    service = EngineService(engine, cache_dir, broker.redis_url, identity, tiers, kv_redis_url, simulated)
    leases = LeaseKeeper(service.redis, identity.name, broker.lease_ttl_s, broker.heartbeat_interval_s)
    register_tasks(app, JobRunner(service, leases, broker.job_time_limit_s, broker.result_ttl_s))
    maintenance = Maintenance(
        service, broker.heartbeat_interval_s, orphan_grace_s=3 * broker.lease_ttl_s, app=app
    )
    status = StatusReader(service, maintenance, concurrency, engine.max_num_seqs)
    heartbeat = Heartbeat(status, broker.heartbeat_interval_s, broker.heartbeat_ttl_s)
    drain = Drain(service, heartbeat, drain_timeout_s)
    register_control(service, drain)  # `kvferry_integrity` (chaos), `kvferry_drain`

    def on_shutdown(sig: str = "", how: str = "", **_: object) -> None:
        drain.begin(f"{how or 'warm'} shutdown, {sig or 'asked'}")

    worker_shutting_down.connect(on_shutdown, weak=False)
    parts = {"heartbeat": heartbeat, "maintenance": maintenance, "supervisor": Supervisor(service)}
    step = type("KVFigures", (KVFiguresStep,), parts)
    app.steps["worker"].add(step)
    # A restart under the same name (compose keeps the hostname): the previous process's jobs go
    # back now (before the model load, so the other workers resume them meanwhile), not after the
    # visibility timeout, and before this one takes any.
    release_own(service.redis, identity.name, leases.owner)
    if preload:
        service.loop()
        # before the consumer (and the heartbeat routing reads) starts: no message is taken until
        # the hottest prefixes are warm (workers/tiers/warm_start.py)
        service.warm_start()
    worker = app.Worker(
        hostname=identity.name,
        pool="threads",
        concurrency=concurrency,
        queues=[keys.SHARED_QUEUE, identity.queue],
        loglevel=loglevel,
        without_mingle=True,
        without_gossip=True,
    )
    try:
        worker.start()
    finally:
        drain.finished.set()  # the pool is done: no job left to hand back
        service.shutdown()  # the KV writer writes through what it holds
        leases.stop()
        drain.leave()
