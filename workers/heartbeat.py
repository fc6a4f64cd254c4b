"""Heartbeat: a worker's status in Redis every interval (TTL'd, so a dead worker disappears),
and a reaper pass for workers that did disappear."""

from __future__ import annotations

import logging
import threading

import redis

from broker import keys
from broker.worker_registry import HEARTBEAT_FIELD, encode_status
from workers import reaper
from workers.engine_service import EngineService

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(self, service: EngineService, interval_s: float, ttl_s: int) -> None:
        self.service = service
        self.interval_s = interval_s
        self.ttl_s = ttl_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvferry-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        name = self.service.identity.name
        self.service.redis.delete(keys.worker_heartbeat(name))  # a clean exit is not a death
        self.service.redis.srem(keys.WORKERS, name)

    def beat(self) -> None:
        status = self.service.status()
        pipe = self.service.redis.pipeline(transaction=False)
        key = keys.worker_heartbeat(status.name)
        pipe.hset(key, HEARTBEAT_FIELD, encode_status(status))
        pipe.expire(key, self.ttl_s)
        pipe.sadd(keys.WORKERS, status.name)
        pipe.execute()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.beat()
                reaper.reap(self.service.redis, self.service.identity.name)
                self.service.sweep_sessions()
            except (redis.RedisError, TimeoutError) as exc:
                log.warning("heartbeat failed: %s", exc)
            self._stop.wait(self.interval_s)
