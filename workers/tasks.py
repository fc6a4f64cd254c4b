"""Celery task adapters: decode, hand to the engine service, encode. Nothing else."""

from __future__ import annotations

from typing import Any

from celery import Celery, Task

from broker import keys
from broker.codec import decode_job, encode_result
from workers.engine_service import EngineService


def register_tasks(app: Celery, service: EngineService) -> None:
    @app.task(name=keys.GENERATE_TASK, bind=True, acks_late=True, reject_on_worker_lost=True)
    def generate(self: Task, job: dict[str, Any]) -> dict[str, Any]:
        """kvferry.generate(job) -> result: the public task (see broker/messages.py for both)."""
        job_id = self.request.id
        return encode_result(service.run(job_id, decode_job(job)))
