"""PackTransaction: one write of the cold tier, its packs and their index entries
(kvstore/redis/tier.py sends a put as several, each self-contained).

On one Redis, one MULTI/EXEC: each pack SET NX, then lua/register.lua indexes them and evicts to
the capacity, all or nothing. On a Redis Cluster the packs live on every shard and the metadata
in one slot (kvstore/redis/keys.py), so no transaction spans them: the packs are SET NX first,
one pipeline per shard (kvstore/redis/nodes.py), then the script registers those that were
stored, and the packs it evicted are UNLINKed on their shards. A pack whose shard is down is not
registered: its blocks stay unindexed (a miss later, never a wrong block) and the send reports
them. A worker that dies between the SETs and the script leaves packs nobody indexed; they carry
PACK_TTL_S and are evictable (volatile-lru), so they go by themselves.

Redis refuses a write it cannot make room for (OOM, the whole transaction discarded) when what
fills its memory is no evictable key: large replies in flight count against maxmemory too (two
MGETs of a few MB beside a write fill an 8 MB Redis). It refuses either a queued command (redis-py
raises OutOfMemoryError) or, when memory went over between queueing and EXEC, the EXEC itself
(ExecAbortError "... because of: OOM ..."). Nothing of a refused transaction ran and the buffers
drain in milliseconds, so the tier sends it once more after OOM_RETRY_S; refused again, the write
fails and the KV writer drops it, counted.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from kvstore.chain import BlockHash
from kvstore.redis import nodes, scripts
from kvstore.redis.client import KV_ERRORS, KVClient, is_cluster
from kvstore.redis.keys import PACK_TTL_S, TIER_REGISTRY, TierKeys
from kvstore.tiers.stored_block import StoredBlock

log = logging.getLogger(__name__)
OOM_RETRY_S = 0.05


def refused_over_maxmemory(exc: redis.exceptions.ResponseError) -> bool:
    """Whether Redis discarded a transaction for want of memory (see above)."""
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        return True
    return isinstance(exc, redis.exceptions.ExecAbortError) and "OOM" in str(exc)


class PacksNotWritten(redis.RedisError):
    """A put stored the rest, but these blocks' shard was down (or refused them): a recompute later."""

    def __init__(self, hashes: list[BlockHash]) -> None:
        super().__init__(f"{len(hashes)} block(s) not written to the KV tier: their shard is down")
        self.hashes = hashes


@dataclass(frozen=True, slots=True)
class Sent:
    written: int  # blocks newly indexed
    written_bytes: int
    evicted: int  # packs evicted to keep within the capacity
    unwritten: list[BlockHash] = field(default_factory=list)  # blocks of packs a down shard refused


class PackTransaction:
    def __init__(
        self, client: KVClient, keys: TierKeys, capacity_bytes: int, tenant_quota_bytes: int
    ) -> None:
        self.client = client
        self.keys = keys
        self.capacity_bytes = capacity_bytes
        self.tenant_quota_bytes = tenant_quota_bytes
        self.cluster = is_cluster(client)
        self._register = scripts.TierScript(client, scripts.REGISTER)
        self._in_multi = client.register_script(self._register.text)  # one Redis: run inside MULTI

    def send(
        self, groups: Sequence[Sequence[StoredBlock]], packs: Sequence[bytes], now: float, first: int
    ) -> Sent:
        """SET NX each pack, then the REGISTER script indexes them and evicts to the capacity.
        ``first``: the first group's place in its put."""
        keys = [self.keys.pack([b.block_hash for b in group]) for group in groups]
        args: list[Any] = [self.capacity_bytes, self.tenant_quota_bytes]
        for i, (key, group, pack) in enumerate(zip(keys, groups, packs, strict=True)):
            # A sequence's later packs count as used earlier: its tail is evicted before its prefix.
            args += [key, b"".join(b.block_hash for b in group), now - (first + i) * 1e-6, len(pack)]
        if self.cluster:
            return self._send_cluster(groups, packs, keys, args)
        pipe = cast("redis.Redis", self.client).pipeline(transaction=True)
        for key, pack in zip(keys, packs, strict=True):
            pipe.set(key, pack, nx=True, ex=PACK_TTL_S)
        pipe.sadd(TIER_REGISTRY, self.keys.fingerprint)
        self._in_multi(keys=self.keys.namespace(), args=args, client=pipe)
        written, written_bytes, evicted, _ = cast("list[Any]", pipe.execute())[-1]
        return Sent(int(written), int(written_bytes), int(evicted))

    def _send_cluster(
        self,
        groups: Sequence[Sequence[StoredBlock]],
        packs: Sequence[bytes],
        keys: list[str],
        args: list[Any],
    ) -> Sent:
        stored = nodes.run(
            self.client, [("SET", k, p, "NX", "EX", PACK_TTL_S) for k, p in zip(keys, packs, strict=True)]
        )
        kept, unwritten = args[:2], []
        for i, reply in enumerate(stored):
            if isinstance(reply, Exception):  # its shard is down, or refused it: not indexed
                if isinstance(reply, redis.ResponseError) and refused_over_maxmemory(reply):
                    raise reply  # the tier retries the whole send once
                unwritten += [b.block_hash for b in groups[i]]
            else:
                kept += args[2 + 4 * i : 6 + 4 * i]
        if unwritten:
            errors = [r for r in stored if isinstance(r, Exception)]
            log.warning("%d block(s) not written, their shard refused: %s", len(unwritten), errors[0])
        try:  # every send, as on one Redis: the registry's shard may have come back empty
            self.client.sadd(TIER_REGISTRY, self.keys.fingerprint)
        except KV_ERRORS as exc:  # the registry's shard is down: the next send adds it
            log.warning("registering the tier failed: %s", exc)
        if len(kept) == 2:
            return Sent(0, 0, 0, unwritten)
        written, written_bytes, evicted, dropped = self._register(self.keys.namespace(), kept)
        if dropped:
            nodes.unlink(self.client, dropped)
        return Sent(int(written), int(written_bytes), int(evicted), unwritten)
