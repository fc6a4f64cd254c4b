"""A worker bootstep: starts the heartbeat, maintenance and supervisor threads with the worker, and puts
the KV figures into the worker's info (Flower's worker page, `celery inspect stats`) as flat fields."""

from __future__ import annotations

from typing import Any, ClassVar

from celery import bootsteps

from workers.jobs.maintenance import Maintenance
from workers.process.flower_fields import flat_fields
from workers.process.heartbeat import Heartbeat
from workers.process.supervisor import Supervisor


class KVFiguresStep(bootsteps.StartStopStep):
    heartbeat: ClassVar[Heartbeat]  # set on a subclass made for this process (see worker_main)
    maintenance: ClassVar[Maintenance]
    supervisor: ClassVar[Supervisor]

    def start(self, parent: Any) -> None:
        self.heartbeat.start()
        self.maintenance.start()
        self.supervisor.start()

    def stop(self, parent: Any) -> None:
        self.supervisor.stop()  # a loop stopped for shutdown is not a dead one
        self.maintenance.stop()
        self.heartbeat.stop()

    def info(self, parent: Any) -> dict[str, Any]:
        return flat_fields(self.heartbeat.status.read())  # `kvferry.*` rows of Flower's worker page
