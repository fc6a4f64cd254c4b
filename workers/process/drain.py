"""Drain: how a worker told to stop leaves the fleet without losing a job or a session's cache.

Told by SIGTERM (Kubernetes' scale-in, `kvferry serve --autoscale`, Ctrl-C), or by
`kvferry worker --drain` (the `kvferry_drain` broadcast, workers/process/control.py):

1. at once: Celery's warm shutdown stops consuming (with prefetch = concurrency on the threads
   pool, every message it took is running, none waits unstarted in the worker), and its heartbeat
   goes, so routing sends it nothing more; it stays in keys.WORKERS, so the sweeper's reaper moves
   whatever still lands on its own queue to the shared one;
2. its running jobs finish, for at most `timeout_s`; then the engine loop is stopped, which fails
   the rest with EngineFailedError: their tasks reject their messages for redelivery
   (workers/process/tasks.py), and another worker resumes each after the tokens its stream holds
   (fenced by the lease's epoch: each token reaches the client once);
3. the KV writer writes what it holds through to the Redis tier (EngineService.shutdown): every
   finished turn's blocks, then those turns' session records and pins (AfterWriteQueue.flush), so
   a session's next turn on any worker is served from Redis;
4. it leaves: its own queue's leftovers go to the shared queue, its name leaves keys.WORKERS.
"""

from __future__ import annotations

import logging
import threading

import redis

from broker import keys
from workers.background import BackgroundThread
from workers.jobs.engine_service import EngineService
from workers.jobs.reaper import move_queued
from workers.process.heartbeat import Heartbeat

log = logging.getLogger(__name__)


class Drain:
    def __init__(self, service: EngineService, heartbeat: Heartbeat, timeout_s: float) -> None:
        self.service = service
        self.heartbeat = heartbeat
        self.timeout_s = timeout_s
        self.finished = threading.Event()  # set once Celery's pool has no job left
        self._begun = threading.Event()
        self._lock = threading.Lock()

    @property
    def begun(self) -> bool:
        return self._begun.is_set()

    def begin(self, why: str) -> None:
        """Idempotent; returns at once (it may run in a signal handler): the work is a thread's."""
        with self._lock:
            if self._begun.is_set():
                return
            self._begun.set()
        log.warning("draining (%s): no new jobs; running ones have %.0fs", why, self.timeout_s)
        BackgroundThread("kvferry-drain", self._run).start()

    def _run(self) -> None:
        try:
            self.heartbeat.stop()
        except (redis.RedisError, OSError) as exc:  # it expires by itself within its TTL
            log.warning("drain: cannot remove the heartbeat: %s", exc)
        if self.finished.wait(self.timeout_s):
            return
        running = self.service.counts.running
        log.warning("drain: %d job(s) still running after %.0fs; handing them back", running, self.timeout_s)
        self.service.stop_engine()

    def leave(self) -> int:
        """After the pool has stopped and the writer has written through: off the fleet. Returns
        how many queued messages moved from its own queue to the shared one."""
        self.finished.set()
        name = self.service.identity.name
        client = self.service.redis
        try:
            self.heartbeat.stop()
            moved = move_queued(client, name)
            client.srem(keys.WORKERS, name)
        except (redis.RedisError, OSError) as exc:  # the reaper does it once the heartbeat is gone
            log.warning("drain: cannot leave the fleet cleanly: %s", exc)
            return 0
        if moved:
            log.warning("drain: moved %d job(s) from its own queue to the shared one", moved)
        return moved
