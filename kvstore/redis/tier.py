"""RedisTier: the cold tier, KV block packs in Redis shared by every worker of one model.

Content-addressed: a block is found by its hash, written once and never overwritten. Blocks travel
in packs (block_codec) of ``blocks_per_pack``, since values of a few MB move fastest. Every key is in
kvstore/redis/keys.py; every change to the index, LRU, byte counter and pins is a Lua script
(kvstore/redis/lua, loaded by tier_scripts); the read path is kvstore/redis/reader.py (packs fetched
ahead by tier_fetch); a write's transactions are kvstore/redis/write.py; pins by owner are
kvstore/redis/pins.py; the consistency check is kvstore/redis/integrity.py.

Bounded memory: the tier keeps its own LRU byte cap (``capacity_bytes``), and pinned packs count
against it (pinned bytes are bounded per tenant by ``tenant_quota_bytes``; when pinned packs alone
exceed the cap, the oldest owner of the tenant most over its quota loses its pins first). The KV
Redis may also be capped by Redis itself: run it with ``maxmemory`` and ``maxmemory-policy
volatile-lru``. Only packs carry a TTL (PACK_TTL_S, renewed on every read), so Redis can evict
packs and never the index, LRU, counters or pins (keys without a TTL); an index entry whose pack
Redis evicted reads as a miss, is cleaned up on the spot (lua/repair.lua), and the blocks are
written again by the next worker that computes them. A tier whose keys were flushed altogether
reads as empty.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence

import redis

from kvstore.chain import BlockHash
from kvstore.layout import KVFormat
from kvstore.redis import pins as tier_pins
from kvstore.redis.client import KV_ERRORS, KVClient
from kvstore.redis.fetch import PackFetcher, batched
from kvstore.redis.integrity import TierIntegrityError, check_integrity
from kvstore.redis.keys import HASH_LEN, PACK_TTL_S, PinOwner, TierKeys
from kvstore.redis.pins import PinChange
from kvstore.redis.reader import TierRead, TierReader, leading
from kvstore.redis.write import OOM_RETRY_S, PacksNotWritten, PackTransaction, refused_over_maxmemory
from kvstore.tiers.codec import encode_pack
from kvstore.tiers.quant import TierDtype, check_tier_dtype, encoded_nbytes
from kvstore.tiers.stats import RedisTierStats
from kvstore.tiers.stored_block import StoredBlock

log = logging.getLogger(__name__)
Hook = Callable[[], None] | None
__all__ = ["HASH_LEN", "PACK_TTL_S", "PinChange", "RedisTier", "TierIntegrityError", "TierKeys"]

# Packs per MULTI/EXEC, in bytes: Redis runs a transaction whole, so a turn's write-through
# (~60 MB for 1,300 tokens of SmolLM2) in one would stall every other client of that Redis and take
# its memory past maxmemory by its size before any eviction; a few packs at a time do neither.
TX_BYTES = 4 * 1024**2
# A read that found the KV Redis (or the tier's metadata shard) away: reads miss at once this long,
# so a Redis down costs one read its timeout, not every read.
DOWN_S = 5.0

_LOCAL_COUNTERS = (
    "blocks_written",
    "bytes_written",
    "blocks_read",
    "bytes_read",
    "read_hits",
    "read_misses",
    "packs_dropped",
    "packs_evicted",
    "write_oom_retries",
)


class RedisTier:
    def __init__(
        self,
        client: KVClient,
        fmt: KVFormat,
        capacity_bytes: int,
        blocks_per_pack: int | None = None,
        target_pack_bytes: int = 2 * 1024**2,
        tenant_quota_bytes: int = 0,
        tier_dtype: str = "exact",
    ) -> None:
        """``tier_dtype``: how blocks are stored here (kvstore/tiers/quant.py): "exact" (the pool's
        bytes) or a lossy, smaller "int8" | "fp16" | "bf16", each a namespace of its own."""
        if client.get_encoder().decode_responses:
            raise ValueError("RedisTier needs a client with decode_responses=False: packs are binary")
        if capacity_bytes < 0 or tenant_quota_bytes < 0:
            raise ValueError(f"capacity {capacity_bytes} and quota {tenant_quota_bytes} must be >= 0")
        self.tier_dtype: TierDtype = check_tier_dtype(tier_dtype)
        self.stored_block_bytes = encoded_nbytes(fmt, self.tier_dtype)  # one block, as stored
        if blocks_per_pack is None:
            blocks_per_pack = max(1, target_pack_bytes // self.stored_block_bytes)
        if blocks_per_pack < 1:
            raise ValueError(f"blocks_per_pack must be >= 1, got {blocks_per_pack}")
        self.client = client
        self.fmt = fmt
        self.capacity_bytes = capacity_bytes
        self.tenant_quota_bytes = tenant_quota_bytes  # 0: no quota
        self.blocks_per_pack = blocks_per_pack
        self.keys = TierKeys.for_tier(fmt.model_fingerprint, self.tier_dtype)
        self.fetcher = PackFetcher(client, blocks_per_pack * self.stored_block_bytes)
        self._reader = TierReader(client, self.keys, fmt, self.tier_dtype, self.fetcher)
        self._lock = threading.Lock()  # guards the counters: writer and task threads share a tier
        self._counts = dict.fromkeys(_LOCAL_COUNTERS, 0)
        self._tx = PackTransaction(client, self.keys, capacity_bytes, tenant_quota_bytes)
        self._down_until = 0.0  # reads failed: until then every read is a miss at once (DOWN_S)
        self.oom_pause: Callable[[], None] = lambda: time.sleep(OOM_RETRY_S)  # tests drain Redis here

    def put(
        self, blocks: Sequence[StoredBlock], before_tx: Hook = None, alone: Collection[BlockHash] = ()
    ) -> int:
        """Write the blocks not yet indexed, consecutive ones packed together; returns blocks written.
        Those in ``alone`` get a pack of their own (a pack is read whole, and a session turn's tail
        is read alone, kvstore/tiers/tail.py).

        Packs are encoded and written a transaction (TX_BYTES) at a time; ``before_tx`` is called
        before each (the KV writer yields the cores to a busy engine there). Then evicts least
        recently used unpinned packs until the stored bytes fit the capacity. On a Redis Cluster
        whose shard is down, the packs for that shard are not written: the rest are, then
        PacksNotWritten names the blocks left out (the KV writer counts and drops them).
        """
        for block in blocks:  # all checked before anything is written
            sizes = (len(block.block_hash), len(block.token_ids), len(block.kv))
            if sizes != (HASH_LEN, self.fmt.block_size, self.fmt.nbytes):
                raise ValueError(f"block {block.block_hash.hex()}: hash, tokens, KV sizes {sizes}")
        unique = list({b.block_hash: b for b in blocks}.values())
        if not unique:
            return 0
        groups = self._new_packs(unique, self._reader.locate([b.block_hash for b in unique]), alone)
        now = time.time()
        written, first, size = 0, 0, 0
        tx_packs: list[bytes] = []
        unwritten: list[BlockHash] = []  # blocks a down shard refused
        for i, group in enumerate(groups):  # one MULTI/EXEC per TX_BYTES of packs, each self-contained
            pack = encode_pack(self.fmt, group, self.tier_dtype)
            if tx_packs and size + len(pack) > TX_BYTES:
                written += self._put_packs(groups[first:i], tx_packs, now, first, unwritten, before_tx)
                first, size, tx_packs = i, 0, []
            tx_packs.append(pack)
            size += len(pack)
        if tx_packs:
            written += self._put_packs(groups[first:], tx_packs, now, first, unwritten, before_tx)
        if unwritten:
            raise PacksNotWritten(unwritten)
        return written

    def _put_packs(
        self,
        groups: Sequence[Sequence[StoredBlock]],
        packs: Sequence[bytes],
        now: float,
        first: int,
        unwritten: list[BlockHash],
        before_tx: Callable[[], None] | None = None,
    ) -> int:
        """The packs and their index entries in one MULTI/EXEC; returns the blocks written."""
        if before_tx is not None:
            before_tx()
        try:
            sent = self._tx.send(groups, packs, now, first)
        except redis.exceptions.ResponseError as exc:
            if not refused_over_maxmemory(exc):
                raise
            log.info("the KV Redis is over maxmemory, nothing to evict: writing again in %g s", OOM_RETRY_S)
            self._count(write_oom_retries=1)
            self.oom_pause()
            if before_tx is not None:
                before_tx()
            sent = self._tx.send(groups, packs, now, first)
        unwritten += sent.unwritten
        self._count(blocks_written=sent.written, bytes_written=sent.written_bytes, packs_evicted=sent.evicted)
        return sent.written

    def get_run(
        self,
        hashes: Sequence[BlockHash],
        token_ids: Sequence[Sequence[int]] | None = None,
        cause: str = "job",
    ) -> list[StoredBlock]:
        """The valid blocks of hashes[0], hashes[1], ... up to the first one missing. `cause`: why
        (kvstore/redis/keys.py READ_CAUSES), counted in the shared counters.

        A block whose tokens differ from ``token_ids[i]`` counts as missing. A corrupt or foreign
        pack ends the run and is deleted, so the next reader does not fetch it again; a pack Redis
        evicted ends it too (a miss, never an error), as does one on a Redis Cluster shard that is
        down. When the KV Redis (or the shard of the tier's metadata) is down, every block misses.
        """
        if token_ids is not None and len(token_ids) != len(hashes):
            raise ValueError(f"{len(hashes)} hashes but {len(token_ids)} token lists")
        if not hashes:
            return []
        read = TierRead([], 0, 0, 0)
        if time.monotonic() >= self._down_until:
            try:
                read = self._reader.read_run(hashes, token_ids, cause)
            except KV_ERRORS as exc:  # the KV Redis (or the tier's metadata shard) is away: all misses
                log.warning("reading the Redis tier failed, misses for %g s: %s", DOWN_S, exc)
                self._down_until = time.monotonic() + DOWN_S
        run = read.blocks
        self._count(
            blocks_read=read.blocks_read,
            bytes_read=read.bytes_read,
            read_hits=len(run),
            read_misses=len(hashes) - len(run),
            packs_dropped=read.packs_dropped,
        )
        return run

    def contains_run(self, hashes: Sequence[BlockHash]) -> int:
        """How many of hashes[0], hashes[1], ... the index holds, up to the first it does not."""
        if not hashes:
            return 0
        if time.monotonic() < self._down_until:
            return 0
        try:
            return len(leading(self._reader.locate(hashes)))
        except KV_ERRORS as exc:
            log.warning("reading the Redis tier's index failed, misses for %g s: %s", DOWN_S, exc)
            self._down_until = time.monotonic() + DOWN_S
            return 0

    def pin_session(
        self, tenant: str, session_id: str, hashes: Sequence[BlockHash], version: float | None = None
    ) -> PinChange:
        """The session's pins become exactly the indexed blocks among ``hashes`` (its chain now):
        new ones pinned, the ones that left the chain unpinned, in one script. ``version`` (the
        turn's time) keeps an older turn that finishes last from undoing a newer turn's pins."""
        return self._pin(PinOwner.session(tenant, session_id), hashes, replace=True, version=version)

    def pin_preload(self, tenant: str, hashes: Sequence[BlockHash]) -> PinChange:
        """Add to the tenant's preloaded pins (prompt templates); they stay until released."""
        return self._pin(PinOwner.preload(tenant), hashes, replace=False, version=None)

    def release_session(self, tenant: str, session_id: str) -> int:
        """Every pin of the session goes now; returns the blocks unpinned."""
        return tier_pins.release(self.client, self.keys, [PinOwner.session(tenant, session_id)])

    def pinned_bytes_by_tenant(self) -> dict[str, int]:
        return tier_pins.pinned_bytes_by_tenant(self.client, self.keys)

    def stats(self) -> RedisTierStats:
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.keys.bytes)
        pipe.zcard(self.keys.lru)
        stored, packs = pipe.execute()
        with self._lock:
            counts = dict(self._counts)
        return RedisTierStats(
            bytes_stored=int(stored or 0), packs=int(packs), capacity_bytes=self.capacity_bytes, **counts
        )

    def clear(self) -> None:
        """Delete every key of this model's tier (tests, admin); other models' keys stay."""
        for pattern in (self.keys.pattern, self.keys.pack_pattern):
            for batch in batched(list(self.client.scan_iter(match=pattern, count=1000)), 500):
                self.client.delete(*batch)

    def check_integrity(self) -> None:
        """Raise TierIntegrityError if the keys disagree (tests, admin: it reads every pack's size)."""
        check_integrity(self.client, self.keys, self.stored_block_bytes)

    def _pin(
        self, owner: PinOwner, hashes: Sequence[BlockHash], replace: bool, version: float | None
    ) -> PinChange:
        change = tier_pins.pin_owner(
            self.client,
            self.keys,
            owner,
            hashes,
            block_bytes=self.stored_block_bytes,
            capacity_bytes=self.capacity_bytes,
            quota_bytes=self.tenant_quota_bytes,
            replace=replace,
            version=version,
        )
        self._count(packs_evicted=change.packs_evicted)
        return change

    def _new_packs(
        self, blocks: list[StoredBlock], indexed: list[bytes | None], alone: Collection[BlockHash] = ()
    ) -> list[list[StoredBlock]]:
        """The blocks not indexed yet, in runs cut at indexed ones, at blocks_per_pack and around
        those in `alone`."""
        groups: list[list[StoredBlock]] = []
        extend = False
        for block, pack_key in zip(blocks, indexed, strict=True):
            if pack_key is not None:
                extend = False
            elif block.block_hash in alone:
                groups.append([block])
                extend = False
            elif extend and len(groups[-1]) < self.blocks_per_pack:
                groups[-1].append(block)
            else:
                groups.append([block])
                extend = True
        return groups

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._counts[name] += delta
