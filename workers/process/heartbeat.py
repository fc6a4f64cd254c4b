"""Heartbeat: a worker's status in Redis every interval (TTL'd, so a dead worker disappears).

Its thread does nothing else: the status is built without waiting on the engine, its lock or the
model load (workers/process/status.py), and reaping and session sweeps run on their own thread
(workers/jobs/maintenance.py), so a busy engine or a slow sweep never delays a beat."""

from __future__ import annotations

import logging

import redis

from broker import keys
from broker.worker_registry import HEARTBEAT_FIELD, MAINTENANCE_FIELD, encode_status
from workers.background import BackgroundThread
from workers.jobs.maintenance import encode_maintenance
from workers.process.status import StatusReader

log = logging.getLogger(__name__)
ANNOUNCE_EVERY = 8  # beats


class Heartbeat:
    def __init__(self, status: StatusReader, interval_s: float, ttl_s: int) -> None:
        self.status = status
        self.redis = status.service.redis
        self.name = status.service.identity.name
        self.interval_s = interval_s
        self.ttl_s = ttl_s
        self._since_announce = 0
        self._thread = BackgroundThread("kvferry-heartbeat", self._run)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """No more beats, and the heartbeat goes at once: routing stops sending work here. The
        worker stays in keys.WORKERS until it has left (workers/process/drain.py): meanwhile the
        sweeper's reaper moves what still lands in its own queue to the shared one, and hands
        back any job whose lease lapses (its leases are renewed until it exits)."""
        self._thread.stop()
        self.redis.delete(keys.worker_heartbeat(self.name))

    def beat(self) -> None:
        """Two commands; the announcement (SADD to keys.WORKERS, which only the reaper undoes, once
        the heartbeat is gone) goes with the first beat, after a failed one and every ANNOUNCE_EVERY."""
        status = self.status.read()
        pipe = self.redis.pipeline(transaction=False)
        key = keys.worker_heartbeat(status.name)
        figures = encode_maintenance(self.status.maintenance())
        pipe.hset(key, mapping={HEARTBEAT_FIELD: encode_status(status), MAINTENANCE_FIELD: figures})
        pipe.expire(key, self.ttl_s)
        if self._since_announce == 0:
            pipe.sadd(keys.WORKERS, status.name)
        try:
            pipe.execute()
        except BaseException:
            self._since_announce = 0  # announce again with the next beat
            raise
        self._since_announce = (self._since_announce + 1) % ANNOUNCE_EVERY

    def _run(self) -> None:
        while not self._thread.stopped:
            try:
                self.beat()
            except (redis.RedisError, OSError) as exc:
                log.warning("heartbeat failed: %s", exc)
            except Exception:  # the beat thread must outlive any one bad status
                log.exception("heartbeat failed")
            self._thread.wait(self.interval_s)
