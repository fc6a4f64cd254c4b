"""The sweeper lease: one worker of the fleet at a time runs the sweeps whose Redis work would
otherwise grow with workers x jobs (the reaper's heartbeat check, the orphan sweep, the lost-message
resend, the session expiry sweep, the KV tier's report).

A redis-py Lock (keys.SWEEPER_LEASE, token "<worker>|<uuid>"): every maintenance pass, its holder
extends it to its full TTL (a token-checked script); every other worker tries to take it (SET NX
PX, one command). A holder that dies stops renewing, and the lease lapses within its TTL: the next
pass of another worker takes it over. Exclusivity is for cost, not correctness: a holder stalled
past the TTL may run one pass alongside its successor, and every sweep step is atomic per entry
(WATCH, scripts) as it was when every worker ran them all.
"""

from __future__ import annotations

import contextlib
import logging
import uuid

import redis
from redis.exceptions import LockError
from redis.lock import Lock

from broker import keys

log = logging.getLogger(__name__)


class SweeperLease:
    def __init__(self, client: redis.Redis, worker: str, ttl_s: float) -> None:
        self.worker = worker
        self.ttl_s = ttl_s
        self._lock: Lock = client.lock(keys.SWEEPER_LEASE, timeout=ttl_s, blocking=False, thread_local=False)
        self.owned = False

    def hold(self) -> bool:
        """Renew the lease if this worker holds it, else try to take it; True while it is ours."""
        if self.owned:
            try:
                self._lock.reacquire()
                return True
            except LockError:
                self.owned = False
                log.warning("%s lost the sweeper lease", self.worker)
        self.owned = bool(self._lock.acquire(blocking=False, token=f"{self.worker}|{uuid.uuid4().hex}"))
        if self.owned:
            log.info("%s is the fleet's sweeper now", self.worker)
        return self.owned

    def release(self) -> None:
        """At a clean stop: another worker takes over at its next pass, not a TTL later."""
        if self.owned:
            self.owned = False
            with contextlib.suppress(LockError, redis.RedisError):
                self._lock.release()


def holder(client: redis.Redis) -> str | None:
    """The worker that holds the sweeper lease now, if any."""
    raw = client.get(keys.SWEEPER_LEASE)
    if raw is None:
        return None
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return text.rpartition("|")[0] or text
