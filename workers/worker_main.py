"""Start one Celery worker process (threads pool) around one engine."""

from __future__ import annotations

import socket
from pathlib import Path

from broker import keys
from broker.celery_app import BrokerConfig, make_celery, queue
from workers.bootstep import KVFiguresStep
from workers.engine.config import EngineConfig
from workers.engine_service import EngineService, TierConfig, WorkerIdentity
from workers.heartbeat import Heartbeat
from workers.tasks import register_tasks


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
) -> None:
    """Blocks until the worker shuts down. Concurrency = how many jobs share the engine's batch."""
    identity = WorkerIdentity(node_name(name))
    app = make_celery(broker)
    app.conf.task_queues = [queue(keys.SHARED_QUEUE), queue(identity.queue)]
    service = EngineService(engine, cache_dir, broker.redis_url, identity, tiers)
    register_tasks(app, service)
    step = type(
        "KVFigures",
        (KVFiguresStep,),
        {"heartbeat": Heartbeat(service, broker.heartbeat_interval_s, broker.heartbeat_ttl_s)},
    )
    app.steps["worker"].add(step)
    if preload:
        service.loop()
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
        service.shutdown()
