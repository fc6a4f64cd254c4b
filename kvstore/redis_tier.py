"""RedisTier: the cold tier, KV block packs in Redis shared by every worker of one model.

Content-addressed: a block is found by its hash, written once and never overwritten. Blocks travel
in packs (block_codec) of ``blocks_per_pack``, since values of a few MB move fastest. Every key is in
kvstore/tier_keys.py; every change to the index, LRU, byte counter and pins is a Lua script
(kvstore/lua, loaded by tier_scripts); pins by owner are kvstore/tier_pins.py; the consistency
check is kvstore/tier_integrity.py.

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
from collections.abc import Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar, cast

import redis

from kvstore import tier_pins, tier_scripts
from kvstore.block_codec import decode_pack, encode_pack
from kvstore.block_hash import BlockHash
from kvstore.kv_quant import TierDtype, check_tier_dtype, encoded_nbytes
from kvstore.stored_block import KVFormat, StoredBlock
from kvstore.tier_integrity import TierIntegrityError, check_integrity
from kvstore.tier_keys import HASH_LEN, TIER_REGISTRY, PinOwner, TierKeys
from kvstore.tier_pins import PinChange
from kvstore.tier_stats import RedisTierStats

__all__ = ["HASH_LEN", "PinChange", "RedisTier", "TierIntegrityError", "TierKeys"]

log = logging.getLogger(__name__)
T = TypeVar("T")
PACK_TTL_S = 30 * 86400  # what makes packs (and only packs) evictable under volatile-lru
# Per MGET: one huge reply would hold Redis (and the job queue) longer, and the read path decodes
# one MGET's packs while the next is on the wire (measured: 4 MB overlaps best at 2-block packs).
_MAX_MGET_BYTES = 4 * 1024**2
_LOCAL_COUNTERS = (
    "blocks_written",
    "bytes_written",
    "blocks_read",
    "bytes_read",
    "read_hits",
    "read_misses",
    "packs_dropped",
    "packs_evicted",
)


class RedisTier:
    def __init__(
        self,
        client: redis.Redis,
        fmt: KVFormat,
        capacity_bytes: int,
        blocks_per_pack: int | None = None,
        target_pack_bytes: int = 2 * 1024**2,
        tenant_quota_bytes: int = 0,
        tier_dtype: str = "exact",
    ) -> None:
        """``tier_dtype``: how blocks are stored here (kvstore/kv_quant.py): "exact" (the pool's
        bytes) or a lossy, smaller "int8" | "fp16" | "bf16", each a namespace of its own."""
        if client.connection_pool.connection_kwargs.get("decode_responses"):
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
        self._repair_script = client.register_script(tier_scripts.script(tier_scripts.REPAIR))
        self._lock = threading.Lock()  # guards the counters: writer and task threads share a tier
        self._counts = dict.fromkeys(_LOCAL_COUNTERS, 0)
        self._fetcher: ThreadPoolExecutor | None = None  # fetches the next MGET while one decodes

    def put(self, blocks: Sequence[StoredBlock]) -> int:
        """Write the blocks not yet indexed, consecutive ones packed together; returns blocks written.

        Then evicts least recently used unpinned packs until the stored bytes fit the capacity.
        """
        for block in blocks:  # all checked before anything is written
            sizes = (len(block.block_hash), len(block.token_ids), len(block.kv))
            if sizes != (HASH_LEN, self.fmt.block_size, self.fmt.nbytes):
                raise ValueError(f"block {block.block_hash.hex()}: hash, tokens, KV sizes {sizes}")
        unique = list({b.block_hash: b for b in blocks}.values())
        if not unique:
            return 0
        groups = self._new_packs(unique, self._locate([b.block_hash for b in unique]))
        if not groups:
            return 0
        now = time.time()
        pipe = self.client.pipeline(transaction=True)  # one MULTI/EXEC
        keys: list[str] = []
        args: list[bytes | float] = []
        for i, group in enumerate(groups):
            members = [b.block_hash for b in group]
            keys.append(self.keys.pack(members))
            pipe.set(keys[-1], encode_pack(self.fmt, group, self.tier_dtype), nx=True, ex=PACK_TTL_S)
            # A sequence's later packs count as used earlier: its tail is evicted before its prefix.
            args += [b"".join(members), now - i * 1e-6]
        pipe.sadd(TIER_REGISTRY, self.keys.fingerprint)
        namespace = [*self.keys.namespace(), *keys]
        pipe.eval(
            tier_scripts.script(tier_scripts.REGISTER),
            len(namespace),
            *namespace,
            self.capacity_bytes,
            self.tenant_quota_bytes,
            *args,
        )
        written, written_bytes, evicted = (int(n) for n in pipe.execute()[-1])
        self._count(blocks_written=written, bytes_written=written_bytes, packs_evicted=evicted)
        return written

    def get_run(
        self, hashes: Sequence[BlockHash], token_ids: Sequence[Sequence[int]] | None = None
    ) -> list[StoredBlock]:
        """The valid blocks of hashes[0], hashes[1], ... up to the first one missing.

        A block whose tokens differ from ``token_ids[i]`` counts as missing. A corrupt or foreign
        pack ends the run and is deleted, so the next reader does not fetch it again; a pack Redis
        evicted ends it too (a miss, never an error).
        """
        if token_ids is not None and len(token_ids) != len(hashes):
            raise ValueError(f"{len(hashes)} hashes but {len(token_ids)} token lists")
        if not hashes:
            return []
        lead = _leading(self._locate(hashes))
        stream = self._stream(list(dict.fromkeys(lead)))
        bytes_read = 0
        opened: dict[bytes, dict[BlockHash, StoredBlock]] = {}  # pack key -> its valid blocks
        corrupt: list[bytes] = []
        missing: list[bytes] = []  # (hash, pack key): an index entry naming a pack that is gone
        used: list[bytes] = []  # packs the run came from, in order
        run: list[StoredBlock] = []
        blocks_read = 0
        for i, pack_key in enumerate(lead):
            if pack_key not in opened:
                streamed_key, data = next(stream)  # packs arrive in the order of their first use
                assert streamed_key == pack_key
                if data is None:  # evicted since the index was read (by us or by Redis), or deleted
                    missing += [hashes[i], pack_key]
                    break
                bytes_read += len(data)
                decoded = decode_pack(self.fmt, data, self.tier_dtype)
                blocks_read += len(decoded.blocks) + decoded.dropped
                opened[pack_key] = {b.block_hash: b for b in decoded.blocks}
                if decoded.reason is not None:  # its valid blocks still serve this read
                    corrupt.append(pack_key)
            block = opened[pack_key].get(hashes[i])
            if block is None:  # dropped by the codec, or never in the pack its index names
                if pack_key not in corrupt:
                    corrupt.append(pack_key)
                break
            if token_ids is not None and tuple(token_ids[i]) != block.token_ids:
                break
            run.append(block)
            if not used or used[-1] != pack_key:
                used.append(pack_key)
        stream.close()
        self._touch(used, hits=len(run), misses=len(hashes) - len(run), bytes_read=bytes_read)
        if corrupt or missing:
            try:
                self._repair_script(keys=[*self.keys.namespace(), *corrupt], args=missing)
            except redis.ResponseError:  # e.g. OOM: the next reader repairs it
                log.warning("repairing the Redis tier failed", exc_info=True)
        self._count(
            blocks_read=blocks_read,
            bytes_read=bytes_read,
            read_hits=len(run),
            read_misses=len(hashes) - len(run),
            packs_dropped=len(corrupt),
        )
        return run

    def contains_run(self, hashes: Sequence[BlockHash]) -> int:
        """How many of hashes[0], hashes[1], ... the index holds, up to the first it does not."""
        if not hashes:
            return 0
        return len(_leading(self._locate(hashes)))

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
        for batch in _batched(list(self.client.scan_iter(match=self.keys.pattern, count=1000)), 500):
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

    def _touch(self, used: list[bytes], hits: int, misses: int, bytes_read: int) -> None:
        """A read's bookkeeping: the packs used are the most recent now, their TTL renewed, the
        shared counters raised. Best effort: a Redis at maxmemory may refuse it, the read stands."""
        pipe = self.client.pipeline(transaction=False)
        if used:
            now = time.time()
            pipe.zadd(self.keys.lru, {key: now - j * 1e-6 for j, key in enumerate(used)}, xx=True)
            for key in used:
                pipe.expire(key, PACK_TTL_S)
        c = self.keys.counters
        for name, value in (("hits", hits), ("misses", misses), ("bytes_read", bytes_read)):
            if value:
                pipe.hincrby(c, name, value)
        try:
            pipe.execute()
        except redis.ResponseError:
            log.warning("updating the Redis tier's LRU and counters failed", exc_info=True)

    def _new_packs(self, blocks: list[StoredBlock], indexed: list[bytes | None]) -> list[list[StoredBlock]]:
        """The blocks not indexed yet, in runs cut at indexed ones and at blocks_per_pack."""
        groups: list[list[StoredBlock]] = []
        extend = False
        for block, pack_key in zip(blocks, indexed, strict=True):
            if pack_key is not None:
                extend = False
            elif extend and len(groups[-1]) < self.blocks_per_pack:
                groups[-1].append(block)
            else:
                groups.append([block])
                extend = True
        return groups

    def _locate(self, hashes: Sequence[BlockHash]) -> list[bytes | None]:
        """The pack key of each block, None where the index has none (one round trip)."""
        return cast("list[bytes | None]", self.client.hmget(self.keys.index, list(hashes)))

    def _stream(self, pack_keys: list[bytes]) -> Generator[tuple[bytes, bytes | None]]:
        """(key, value or None) of every pack, in order: MGETs of a few MB, the next one fetched
        on a helper thread while the caller decodes this one's packs (hiredis parses a reply, and
        socket reads, checksums and copies release the GIL, so the two overlap on two cores)."""
        per_call = max(1, _MAX_MGET_BYTES // (self.blocks_per_pack * self.stored_block_bytes))
        chunks = _batched(pack_keys, per_call)
        if len(chunks) <= 1:
            values = self._mget(chunks[0]) if chunks else []
            yield from zip(pack_keys, values, strict=True)
            return
        if self._fetcher is None:
            with self._lock:
                if self._fetcher is None:
                    self._fetcher = ThreadPoolExecutor(1, thread_name_prefix="kv-tier-fetch")
        ahead = self._fetcher.submit(self._mget, chunks[0])
        for i, chunk in enumerate(chunks):
            values = ahead.result()
            if i + 1 < len(chunks):  # a run cut short leaves this one to finish unread
                ahead = self._fetcher.submit(self._mget, chunks[i + 1])
            yield from zip(chunk, values, strict=True)

    def _mget(self, keys: Sequence[bytes]) -> list[bytes | None]:
        return cast("list[bytes | None]", self.client.mget(keys))

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._counts[name] += delta


def _leading(located: list[bytes | None]) -> list[bytes]:
    """The pack keys up to the first block the index does not hold."""
    lead = []
    for pack_key in located:
        if pack_key is None:
            break
        lead.append(pack_key)
    return lead


def _batched(items: Sequence[T], n: int) -> list[Sequence[T]]:
    return [items[i : i + n] for i in range(0, len(items), n)]
