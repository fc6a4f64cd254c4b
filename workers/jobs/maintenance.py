"""Maintenance: the fleet's sweeps, on a thread of their own so that none can delay the heartbeat
(a sweep may unpin many blocks; a reap may move many messages).

Every worker runs a pass every interval, but only the fleet's sweeper (the holder of the sweeper
lease, workers/jobs/sweeper_lease.py) does the sweeps: the reaper (dead workers' jobs back), the
orphan sweep, the lost-message resend, the session expiry sweep and the KV tier's report for
/metrics. Every other worker's pass is one command (its try for the lease), so the fleet's
maintenance costs Redis the same whatever its number of workers; a sweeper that dies is replaced
within the lease's TTL.

Each step fails alone: an exception in one (a malformed entry, a Redis error) is logged and
counted, and the pass goes on with the next; inside the sweeps each entry fails alone as well.
The time passes take and the failures are published with the worker's heartbeat
(workers/process/status.py), for `kvferry bench fleet`.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis
from celery import Celery

from workers.background import BackgroundThread
from workers.jobs import lost_messages, reaper
from workers.jobs.engine_service import EngineService
from workers.jobs.sweeper_lease import SweeperLease
from workers.tiers.report_publisher import publish_report

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MaintenanceFigures:
    passes: int = 0
    sweeps: int = 0  # passes this worker ran as the fleet's sweeper
    busy_s: float = 0.0  # wall time spent in passes, in all (waits for Redis and the GIL included)
    cpu_s: float = 0.0  # the maintenance thread's CPU time in passes, in all
    failures: int = 0  # steps that raised, and entries skipped (malformed)
    sweeper: bool = False  # whether it holds the sweeper lease now


def encode_maintenance(figures: MaintenanceFigures) -> str:
    """JSON for the heartbeat's MAINTENANCE_FIELD (beside the status, which older readers decode
    strictly: a field of its own keeps them reading it)."""
    return json.dumps(dataclasses.asdict(figures))


class Maintenance:
    def __init__(
        self,
        service: EngineService,
        interval_s: float,
        orphan_grace_s: float = 12.0,
        app: Celery | None = None,
        lease_ttl_s: float | None = None,
    ) -> None:
        self.service = service
        self.interval_s = interval_s
        self.orphan_grace_s = orphan_grace_s  # past a lease TTL, with room for a slow start
        self.app = app  # sends lost messages again (workers/jobs/lost_messages.py)
        # the sweeper lease outlives a few missed passes; a dead holder is replaced within it
        ttl = lease_ttl_s if lease_ttl_s is not None else max(2.0, 4 * interval_s)
        self.lease = SweeperLease(service.redis, service.identity.name, ttl)
        self.counts: collections.Counter[str] = collections.Counter()  # failures, by step or kind
        self.figures = MaintenanceFigures()  # an immutable snapshot: read without a lock
        self._thread = BackgroundThread("kvferry-maintenance", self._run)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop(join_s=10)
        self.lease.release()

    def steps(self) -> list[tuple[str, Callable[[], object]]]:
        """The sweeper's steps, in order."""
        client, name = self.service.redis, self.service.identity.name
        out: list[tuple[str, Callable[[], object]]] = [
            ("reap", lambda: reaper.reap(client, name)),
            ("orphans", lambda: reaper.sweep_orphans(client, self.orphan_grace_s, counts=self.counts)),
        ]
        if self.app is not None:
            app = self.app
            out.append(("lost", lambda: lost_messages.resend_lost(client, app, self.orphan_grace_s)))
        out.append(("sessions", lambda: self.service.sessions.sweep_sessions(self.counts)))
        out.append(("report", lambda: publish_report(client, self.service.kv_redis, name)))
        return out

    def run_once(self) -> bool:
        """One pass; True when this worker ran the sweeps (it holds the sweeper lease)."""
        started, cpu_started = time.perf_counter(), time.thread_time()
        # the holder renews every pass; the others try every other pass (the TTL covers both)
        sweeper = False
        if self.lease.owned or self.figures.passes % 2 == 0:
            sweeper = self._step("lease", self.lease.hold) is True
        if sweeper:
            for name, step in self.steps():
                self._step(name, step)
        f = self.figures
        self.figures = MaintenanceFigures(
            f.passes + 1,
            f.sweeps + int(sweeper),
            f.busy_s + time.perf_counter() - started,
            f.cpu_s + time.thread_time() - cpu_started,
            sum(self.counts.values()),
            sweeper,
        )
        return sweeper

    def _step(self, name: str, step: Callable[[], object]) -> object:
        try:
            return step()
        except (redis.RedisError, OSError) as exc:
            log.warning("maintenance step %s failed: %s", name, exc)
        except Exception:
            log.exception("maintenance step %s failed", name)
        self.counts[f"{name}_failed"] += 1
        return None

    def _run(self) -> None:
        while not self._thread.stopped:
            self.run_once()
            self._thread.wait(self.interval_s)
