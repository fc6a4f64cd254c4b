"""A worker bootstep: starts the heartbeat with the worker, and puts the KV figures into the
worker's info (Flower's worker page, `celery inspect stats`)."""

from __future__ import annotations

from typing import Any, ClassVar

from celery import bootsteps

from broker.codec import to_wire
from workers.heartbeat import Heartbeat


class KVFiguresStep(bootsteps.StartStopStep):
    heartbeat: ClassVar[Heartbeat]  # set on a subclass made for this process (see worker_main)

    def start(self, parent: Any) -> None:
        self.heartbeat.start()

    def stop(self, parent: Any) -> None:
        self.heartbeat.stop()

    def info(self, parent: Any) -> dict[str, Any]:
        status = self.heartbeat.service.status()
        figures = to_wire(status)
        if status.engine is not None:
            figures["kv_usage"] = status.engine.kv_usage
            figures["prefix_hit_rate"] = status.engine.prefix_hit_rate
        return {"kvferry": figures}
