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
from broker.jobs.message_copy import copy_keys, forget_lua

EPOCH_TTL_S = DEFAULTS.job_ttl_s  # as long as the job's stream lives

# Lua pieces of the take script. A held lease answers {0, owner, epoch, pttl}; a new epoch is
# raised and the lease given to ARGV[1] for ARGV[2] ms (the epoch key lives ARGV[3] s).
_HELD = (
    "return {0, owner, tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0'), redis.call('PTTL', KEYS[1])}"
)
_NEW_EPOCH = """epoch = redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], ARGV[3])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'epoch', epoch)
redis.call('PEXPIRE', KEYS[1], ARGV[2])"""

# A worker starting a job, in one round trip: the job is listed as the worker's (KEYS[3]: the
# reaper hands it back if the worker dies), the lease is taken and, once it is ours, the queued
# message's copy and its pending entry go (no copy is needed once a worker started it:
# workers/jobs/lost_messages.py) and the stream and the cancel flag are read: after the epoch was raised,
# so no older epoch can append to what was read. A lease this very owner holds is its own take
# whose reply was lost (a connection dropped, the client retried): taken, at the same epoch.
# Only one call per job and owner may be in flight for that to hold (LeaseKeeper.try_take).
_START = f"""
redis.call('SADD', KEYS[3], ARGV[4])
local owner = redis.call('HGET', KEYS[1], 'owner')
local epoch
if owner == ARGV[1] then
  epoch = tonumber(redis.call('HGET', KEYS[1], 'epoch'))
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
elseif owner then
  {_HELD}
else
  {_NEW_EPOCH}
end
{forget_lua(4, 4)}
return {{1, ARGV[1], epoch, tonumber(ARGV[2]), redis.call('XRANGE', KEYS[6], '-', '+'),
        redis.call('EXISTS', KEYS[7])}}
"""

# Renew ours; re-take it if it lapsed while nobody else took it (the epoch is still ours), so a
# Redis hiccup longer than the TTL costs nothing. Anything else: the lease is lost.
_RENEW = """
local owner = redis.call('HGET', KEYS[1], 'owner')
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
if current ~= tonumber(ARGV[2]) then return 0 end
if owner and owner ~= ARGV[1] then return 0 end
if not owner then redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'epoch', ARGV[2]) end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

_RELEASE = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] and redis.call('HGET', KEYS[1], 'epoch') == ARGV[2] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# A worker restarted under its old name: drop the leases its previous life held (that process
# is gone: two live workers never share a name). Their epochs stay, so its writes stay fenced.
_DROP_PREVIOUS = """
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner and string.sub(owner, 1, string.len(ARGV[1])) == ARGV[1] and owner ~= ARGV[2] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


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


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class JobLeases:
    """The lease scripts, registered on one client (redis-py reloads them after a Redis restart)."""

    def __init__(self, client: redis.Redis, ttl_s: float) -> None:
        self.client = client
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self._start = client.register_script(_START)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._drop_previous = client.register_script(_DROP_PREVIOUS)

    def start(self, job_id: str, owner: str, worker_jobs: str) -> Started | LeaseHolder:
        """A new lease (and epoch) if nobody holds one, else who does, for a worker that runs
        the job (its bookkeeping in the same round trip): see _START."""
        reply = self._start(
            keys=[
                keys.job_lease(job_id),
                keys.job_epoch(job_id),
                worker_jobs,
                *copy_keys(job_id),
                keys.job_stream(job_id),
                keys.job_cancel(job_id),
            ],
            args=[owner, self.ttl_ms, EPOCH_TTL_S, job_id],
        )
        if int(reply[0]):
            # XRANGE's reply through Lua: [id, [field, value, ...]] pairs, as redis-py parses it
            entries = [(eid, dict(zip(kv[::2], kv[1::2], strict=True))) for eid, kv in reply[4]]
            return Started(Lease(job_id, owner, int(reply[2])), entries, bool(reply[5]))
        return LeaseHolder(_text(reply[1]), int(reply[2]), int(reply[3]))

    def renew(self, lease: Lease) -> bool:
        """False once the lease is lost (another epoch began)."""
        return bool(
            self._renew(
                keys=[keys.job_lease(lease.job_id), keys.job_epoch(lease.job_id)],
                args=[lease.owner, lease.epoch, self.ttl_ms],
            )
        )

    def release(self, lease: Lease) -> bool:
        return bool(self._release(keys=[keys.job_lease(lease.job_id)], args=[lease.owner, lease.epoch]))

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
        return bool(
            self._drop_previous(keys=[keys.job_lease(job_id)], args=[make_owner(worker_name, ""), owner])
        )

    def current_epoch(self, job_id: str) -> int:
        return int(self.client.get(keys.job_epoch(job_id)) or 0)
