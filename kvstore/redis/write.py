"""PackTransaction: one write of the cold tier, its packs and their index entries in one
MULTI/EXEC (kvstore/redis/tier.py sends a put as several, each self-contained).

Redis refuses a write it cannot make room for (OOM, the whole transaction discarded) when what
fills its memory is no evictable key: large replies in flight count against maxmemory too (two
MGETs of a few MB beside a write fill an 8 MB Redis). It refuses either a queued command (redis-py
raises OutOfMemoryError) or, when memory went over between queueing and EXEC, the EXEC itself
(ExecAbortError "... because of: OOM ..."). Nothing of a refused transaction ran and the buffers
drain in milliseconds, so the tier sends it once more after OOM_RETRY_S; refused again, the write
fails and the KV writer drops it, counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import redis

from kvstore.redis import scripts
from kvstore.redis.keys import PACK_TTL_S, TIER_REGISTRY, TierKeys
from kvstore.tiers.stored_block import StoredBlock

OOM_RETRY_S = 0.05


def refused_over_maxmemory(exc: redis.exceptions.ResponseError) -> bool:
    """Whether Redis discarded a transaction for want of memory (see above)."""
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        return True
    return isinstance(exc, redis.exceptions.ExecAbortError) and "OOM" in str(exc)


class PackTransaction:
    def __init__(
        self, client: redis.Redis, keys: TierKeys, capacity_bytes: int, tenant_quota_bytes: int
    ) -> None:
        self.client = client
        self.keys = keys
        self.capacity_bytes = capacity_bytes
        self.tenant_quota_bytes = tenant_quota_bytes
        self._register = client.register_script(scripts.script(scripts.REGISTER))

    def send(
        self, groups: Sequence[Sequence[StoredBlock]], packs: Sequence[bytes], now: float, first: int
    ) -> list[Any]:
        """SET NX each pack, then the REGISTER script indexes them and evicts to the capacity; the
        replies, the script's last. ``first``: the first group's place in its put."""
        pipe = self.client.pipeline(transaction=True)
        keys: list[str] = []
        args: list[bytes | float] = []
        for i, (group, pack) in enumerate(zip(groups, packs, strict=True)):
            members = [b.block_hash for b in group]
            keys.append(self.keys.pack(members))
            pipe.set(keys[-1], pack, nx=True, ex=PACK_TTL_S)
            # A sequence's later packs count as used earlier: its tail is evicted before its prefix.
            args += [b"".join(members), now - (first + i) * 1e-6]
        pipe.sadd(TIER_REGISTRY, self.keys.fingerprint)
        namespace = [*self.keys.namespace(), *keys]
        self._register(
            keys=namespace, args=[self.capacity_bytes, self.tenant_quota_bytes, *args], client=pipe
        )
        return cast("list[Any]", pipe.execute())
