"""LeaseKeeper: takes, renews and releases the leases of the jobs this process runs, on a thread
of its own (never the engine's), so a long engine step cannot let a live job's lease lapse."""

from __future__ import annotations

import logging
import threading
import time
import uuid

import redis

from broker import keys
from broker.jobs.lease import JobLeases, Lease, LeaseHolder, Started, make_owner
from workers.background import BackgroundThread

log = logging.getLogger(__name__)


class OwnedLease:
    """A lease this process holds; `lost` is set once renewing it finds another epoch began."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.lost = threading.Event()

    @property
    def epoch(self) -> int:
        return self.lease.epoch


class LeaseKeeper:
    def __init__(self, client: redis.Redis, worker_name: str, ttl_s: float, renew_s: float) -> None:
        self.leases = JobLeases(client, ttl_s)
        self.worker_name = worker_name
        self.owner = make_owner(worker_name, uuid.uuid4().hex[:12])  # this process, this life
        self.renew_s = renew_s
        self._owned: dict[str, OwnedLease] = {}
        self._starting: set[str] = set()  # jobs a start() is in flight for (one at a time)
        self._lock = threading.Lock()
        self._thread = BackgroundThread("kvferry-leases", self._run)
        self._thread.start()  # assigned first: its body reads it

    def try_take(self, job_id: str) -> tuple[OwnedLease, Started] | LeaseHolder:
        """The job's lease and what its stream held (JobLeases.start), or who holds the lease."""
        with self._lock:
            # a second copy in this very process: never run it twice (nor take it meanwhile: the
            # start script takes this owner's lease as its own)
            if job_id in self._owned:
                return LeaseHolder(self.owner, self._owned[job_id].epoch, int(self.leases.ttl_ms))
            if job_id in self._starting:
                return LeaseHolder(self.owner, 0, int(self.leases.ttl_ms))
            self._starting.add(job_id)
        try:
            got = self.leases.start(job_id, self.owner, keys.worker_jobs(self.worker_name))
            if isinstance(got, LeaseHolder):
                return got
            owned = OwnedLease(got.lease)
            with self._lock:
                self._owned[job_id] = owned
            return owned, got
        finally:
            with self._lock:
                self._starting.discard(job_id)

    def release(self, owned: OwnedLease) -> None:
        with self._lock:
            if self._owned.get(owned.lease.job_id) is owned:
                del self._owned[owned.lease.job_id]
        try:
            self.leases.release(owned.lease)
        except redis.RedisError as exc:  # it expires on its own
            log.warning("releasing the lease of job %s failed: %s", owned.lease.job_id, exc)

    def stop(self) -> None:
        self._thread.stop()

    def renew_all(self) -> None:
        with self._lock:
            owned = list(self._owned.values())
        for h in owned:
            if h.lost.is_set():
                continue
            try:
                if not self.leases.renew(h.lease):
                    log.warning("job %s: lease epoch %d lost; stopping it", h.lease.job_id, h.epoch)
                    h.lost.set()
            except redis.RedisError as exc:  # Redis away: the fenced writes decide, not us
                log.warning("renewing the lease of job %s failed: %s", h.lease.job_id, exc)

    def _run(self) -> None:
        while not self._thread.wait(self.renew_s):
            started = time.monotonic()
            self.renew_all()
            if time.monotonic() - started > self.renew_s:
                log.warning("renewing %d lease(s) took %.1fs", len(self._owned), time.monotonic() - started)
