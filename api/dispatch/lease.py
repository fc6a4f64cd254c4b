"""The dispatcher lease: one api replica at a time releases parked jobs (api/dispatch/dispatcher.py).

A redis-py asyncio Lock (keys.DISPATCH_LEASE, token "<api>|<uuid>"), the house pattern of
workers/jobs/sweeper_lease.py: its holder renews it to its full TTL every pass (a token-checked
script); every other api tries to take it (SET NX PX). A holder that dies stops renewing and the
lease lapses within its TTL. The release script itself runs only under the lease's current
token (a fence): a holder that stalled past its TTL and lost the lease releases nothing."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import uuid

import redis.asyncio as aioredis
from redis.asyncio.lock import Lock
from redis.exceptions import LockError, RedisError

from broker import keys

log = logging.getLogger(__name__)


def api_name() -> str:
    """This api process, as a lease's holder names it."""
    return f"api@{socket.gethostname()}:{os.getpid()}"


class DispatchLease:
    """key/role: another api-wide duty may be held the same way (the batch runner has its own, fenced
    by an epoch: api/batches/lease.py)."""

    def __init__(
        self,
        client: aioredis.Redis,
        name: str,
        ttl_s: float,
        key: str = keys.DISPATCH_LEASE,
        role: str = "the dispatcher",
    ) -> None:
        self.name = name
        self.ttl_s = ttl_s
        self.role = role
        self._lock: Lock = client.lock(key, timeout=ttl_s, blocking=False, thread_local=False)
        self.token = ""  # the token while held: the release script's fence
        self.held = False

    async def hold(self) -> bool:
        """Renew the lease if this api holds it, else try to take it; True while it is ours."""
        if self.held:
            try:
                await self._lock.reacquire()
                return True
            except LockError:
                self.held = False
                log.warning("%s lost the lease of %s", self.name, self.role)
        token = f"{self.name}|{uuid.uuid4().hex}"
        self.held = bool(await self._lock.acquire(blocking=False, token=token))
        if self.held:
            self.token = token
            log.info("%s is %s now", self.name, self.role)
        return self.held

    async def release(self) -> None:
        """At a clean stop: another api takes over at its next pass, not a TTL later."""
        if self.held:
            self.held = False
            with contextlib.suppress(LockError, RedisError):
                await self._lock.release()


async def holder(client: aioredis.Redis) -> str | None:
    """The api that holds the dispatcher lease now, if any."""
    raw = await client.get(keys.DISPATCH_LEASE)
    if raw is None:
        return None
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return text.rpartition("|")[0] or text
