"""Maintenance: the reaper, the orphan sweep, lost messages sent again, the session sweep and the
KV tier's report for /metrics, on a thread of their own so that none can delay the heartbeat (a
sweep may unpin many blocks; a reap may move many messages)."""

from __future__ import annotations

import logging
import threading

import redis
from celery import Celery

from workers.jobs import lost_messages, reaper
from workers.jobs.engine_service import EngineService
from workers.tiers.report_publisher import publish_report

log = logging.getLogger(__name__)


class Maintenance:
    def __init__(
        self,
        service: EngineService,
        interval_s: float,
        orphan_grace_s: float = 12.0,
        app: Celery | None = None,
    ) -> None:
        self.service = service
        self.interval_s = interval_s
        self.orphan_grace_s = orphan_grace_s  # past a lease TTL, with room for a slow start
        self.app = app  # sends lost messages again (workers/lost_messages.py)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvferry-maintenance", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def run_once(self) -> None:
        reaper.reap(self.service.redis, self.service.identity.name)
        reaper.sweep_orphans(self.service.redis, self.orphan_grace_s)
        if self.app is not None:
            lost_messages.resend_lost(self.service.redis, self.app, self.orphan_grace_s)
        self.service.sessions.sweep_sessions()
        publish_report(self.service.redis, self.service.kv_redis, self.service.identity.name)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except (redis.RedisError, OSError) as exc:
                log.warning("maintenance failed: %s", exc)
            except Exception:
                log.exception("maintenance failed")
            self._stop.wait(self.interval_s)
