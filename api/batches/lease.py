"""The batch runner's lease: one api replica at a time runs every batch. Its token is
"<epoch>|<api>", the epoch a counter raised by every take (keys.BATCH_RUNNER_EPOCH), so no two
holdings ever share a token; every write of the runner checks it, in the same script (a fence:
api/batches/state.py). A holder that stalls past the TTL (a long pass, a Redis failover) and
lost the lease meanwhile writes nothing after that, whatever it was doing."""

from __future__ import annotations

import contextlib
import logging

from redis.asyncio import Redis
from redis.exceptions import RedisError

from api.batches import scripts
from api.batches.state import Fence
from broker import keys

log = logging.getLogger(__name__)


class RunnerLease:
    def __init__(self, redis: Redis, name: str, ttl_s: float) -> None:
        self.redis = redis
        self.name = name
        self.ttl_ms = int(ttl_s * 1000)
        self.token = ""
        self.held = False

    @property
    def fence(self) -> Fence:
        return Fence(self.redis, self.token)

    @property
    def epoch(self) -> int:
        return int(self.token.partition("|")[0] or 0)

    async def hold(self) -> bool:
        """Renew the lease if this runner holds it, else try to take it; True while it is ours."""
        lease = [keys.BATCH_RUNNER_LEASE]
        if self.held:
            if await scripts.run(self.redis, "lease_renew", lease, [self.token, self.ttl_ms]):
                return True
            self.lost()
        token = await scripts.run(
            self.redis, "lease_take", [*lease, keys.BATCH_RUNNER_EPOCH], [self.name, self.ttl_ms]
        )
        if token:
            self.token, self.held = token.decode() if isinstance(token, bytes) else str(token), True
            log.info("%s runs the batches now (epoch %d)", self.name, self.epoch)
        return self.held

    def lost(self) -> None:
        if self.held:
            self.held = False
            log.warning("%s lost the batch runner's lease (epoch %d)", self.name, self.epoch)

    async def release(self) -> None:
        """At a clean stop: another api takes over at its next pass, not a TTL later."""
        if self.held:
            self.held = False
            with contextlib.suppress(RedisError, OSError):
                await scripts.run(self.redis, "lease_release", [keys.BATCH_RUNNER_LEASE], [self.token])
