"""Job leases with fencing: at most one worker runs a job at a time, and a worker that lost its
lease (paused, partitioned, presumed dead and reaped) cannot write to the job any more.

keys.job_lease(job_id) is a hash {owner, epoch} with a TTL its holder renews; keys.job_epoch(job_id)
is the fencing token, raised by every lease taken. Each change is one Lua script, atomic against
the other workers. Writes to the job's stream check the epoch (broker/jobs/events.py), so an old
epoch's write is refused even if its worker never noticed it lost the lease.

An owner is "<worker name>|<process uuid>": the reaper reads the worker out of it, and a worker
restarted under its old name tells its previous life's leases from its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from broker import keys
from broker.defaults import DEFAULTS
from broker.errors import KvferryError
from broker.jobs.message_copy import FORGET_COPY, copy_keys
from broker.redis.lua import Script

EPOCH_TTL_S = DEFAULTS.job_ttl_s  # as long as the job's stream lives

# Each change is a script in lua/ (lease_*.lua), its KEYS and ARGV built by name below.
_START = Script(__file__, "lease_start", (FORGET_COPY,))
_RENEW = Script(__file__, "lease_renew")
_RELEASE = Script(__file__, "lease_release")
_DROP_PREVIOUS = Script(__file__, "lease_drop_previous")


class StaleLeaseError(KvferryError):
    """This worker's epoch is no longer the job's: another worker runs it now. Stop, write nothing."""


@dataclass(frozen=True, slots=True)
class Lease:
    job_id: str
    owner: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Started:
    """A job's lease, just taken, with what its stream held and its cancel flag at that moment."""

    lease: Lease
    entries: Any  # the stream's entries, as XRANGE returns them (job_events.progress_of)
    cancelled: bool


@dataclass(frozen=True, slots=True)
class LeaseHolder:
    """Who holds a job's lease now."""

    owner: str
    epoch: int
    ttl_ms: int

    @property
    def worker(self) -> str:
        return owner_worker(self.owner)


def make_owner(worker_name: str, process_id: str) -> str:
    return f"{worker_name}|{process_id}"


def owner_worker(owner: str) -> str:
    return owner.rpartition("|")[0] or owner


@dataclass(frozen=True, slots=True)
class LeaseStart:
    """KEYS and ARGV of lua/lease_start.lua: a worker taking a job's lease as it starts the job."""

    job_id: str
    owner: str
    worker_jobs: str  # the worker's job set (keys.worker_jobs)
    ttl_ms: int

    def keys(self) -> list[str]:
        return [
            keys.job_lease(self.job_id),
            keys.job_epoch(self.job_id),
            self.worker_jobs,
            *copy_keys(self.job_id),
            keys.job_stream(self.job_id),
            keys.job_cancel(self.job_id),
        ]

    def args(self) -> list[Any]:
        return [self.owner, self.ttl_ms, EPOCH_TTL_S, self.job_id]


@dataclass(frozen=True, slots=True)
class LeaseCheck:
    """KEYS and ARGV of lua/lease_renew.lua (with `ttl_ms`) and lua/lease_release.lua."""

    lease: Lease
    ttl_ms: int | None = None

    def keys(self) -> list[str]:
        return [keys.job_lease(self.lease.job_id), keys.job_epoch(self.lease.job_id)]

    def args(self) -> list[Any]:
        owned = [self.lease.owner, self.lease.epoch]
        return owned if self.ttl_ms is None else [*owned, self.ttl_ms]


@dataclass(frozen=True, slots=True)
class PreviousLease:
    """KEYS and ARGV of lua/lease_drop_previous.lua: a lease of an earlier process of a worker name."""

    job_id: str
    worker_name: str
    owner: str  # this process's: its own lease stays

    def keys(self) -> list[str]:
        return [keys.job_lease(self.job_id)]

    def args(self) -> list[Any]:
        return [make_owner(self.worker_name, ""), self.owner]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class JobLeases:
    """The lease scripts on one client (loaded again after a Redis restart)."""

    def __init__(self, client: redis.Redis, ttl_s: float) -> None:
        self.client = client
        self.ttl_ms = max(1, int(ttl_s * 1000))

    def start(self, job_id: str, owner: str, worker_jobs: str) -> Started | LeaseHolder:
        """A new lease (and epoch) if nobody holds one, else who does, for a worker that runs
        the job (its bookkeeping in the same round trip): see lua/lease_start.lua."""
        reply = _START.run(self.client, LeaseStart(job_id, owner, worker_jobs, self.ttl_ms))
        if int(reply[0]):
            # XRANGE's reply through Lua: [id, [field, value, ...]] pairs, as redis-py parses it
            entries = [(eid, dict(zip(kv[::2], kv[1::2], strict=True))) for eid, kv in reply[4]]
            return Started(Lease(job_id, owner, int(reply[2])), entries, bool(reply[5]))
        return LeaseHolder(_text(reply[1]), int(reply[2]), int(reply[3]))

    def renew(self, lease: Lease) -> bool:
        """False once the lease is lost (another epoch began)."""
        return bool(_RENEW.run(self.client, LeaseCheck(lease, self.ttl_ms)))

    def release(self, lease: Lease) -> bool:
        return bool(_RELEASE.run(self.client, LeaseCheck(lease)))

    def holder(self, job_id: str) -> LeaseHolder | None:
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(keys.job_lease(job_id), ["owner", "epoch"])
        pipe.pttl(keys.job_lease(job_id))
        (owner, epoch), ttl = pipe.execute()
        if owner is None:
            return None
        return LeaseHolder(_text(owner), int(epoch or 0), int(ttl))

    def drop_previous(self, job_id: str, worker_name: str, owner: str) -> bool:
        """Drop a lease held by an earlier process of this worker name (not by `owner`)."""
        return bool(_DROP_PREVIOUS.run(self.client, PreviousLease(job_id, worker_name, owner)))

    def current_epoch(self, job_id: str) -> int:
        return int(self.client.get(keys.job_epoch(job_id)) or 0)
