"""TierBridge: the engine's side of the warm (host memory) and cold (Redis) tiers.

Blocks leave the hot pool only when their slot is reused (lazy LRU eviction): the pool announces
BlockRemoved before the slot is overwritten, and the block's bytes go to the warm tier then (and
on to the cold tier). The two are exclusive: a block the pool indexes (computed, or loaded from the
warm tier) leaves the warm tier, so the warm tier's bytes go to blocks the pool does not hold, and
a returning session's history outgrows the pool plus the warm tier, not the larger of the two.
A finished turn's blocks are handed to the writer (workers/tiers/writer.py): one
copy of them into its staging arena here; bytes, packing, checksums and Redis I/O on its thread.
Admission asks the warm tier for the blocks right after the pool's hits; Redis reads happen
earlier, on the submitting thread, which asks `resident` what this worker holds and hands what it
fetched to the engine thread (admit): it never reads the pool itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from kvstore.chain import BlockHash
from kvstore.layout import KVFormat
from kvstore.pool.block_pool import BlockPool
from kvstore.pool.events import AllBlocksCleared, BlockEvent, BlockRemoved, BlockStored
from kvstore.pool.kv_cache import KVCache
from kvstore.tiers.stored_block import StoredBlock
from kvstore.tiers.tail import Tail, padded, tail_hash
from kvstore.tiers.warm import WarmTier
from workers.engine.tiers.kept_tails import KeptTails
from workers.engine.tiers.pending_write import BlockMeta, PendingWrite
from workers.engine.tiers.resident import ResidentBlocks

ColdSink = Callable[[list[StoredBlock]], None]  # the plain form: blocks as bytes (tests, benches)


class ColdWriter(Protocol):
    """workers/kv_writer.KVWriter, as the engine thread sees it: neither call waits for Redis."""

    on_drop: Callable[[list[BlockHash]], None] | None

    def enqueue(self, blocks: Sequence[StoredBlock] | PendingWrite, pinned: bool = False) -> None: ...

    def stage(
        self,
        metas: Sequence[BlockMeta],
        pool_blocks: torch.Tensor,
        block_ids: Sequence[int],
        pinned: bool = True,
    ) -> int: ...


# Bounds for the sets of hashes remembered across turns: forgetting one costs a redundant write
# (the Redis tier skips blocks it already indexes) or a "warm" instead of "redis" label, nothing more.
MAX_REMEMBERED_HASHES = 200_000


class TierBridge:
    """Moves blocks between the hot pool and the tiers; it stores none itself (WarmTier and the
    Redis tier do)."""

    def __init__(self, pool: BlockPool, kv_cache: KVCache, fmt: KVFormat, warm: WarmTier) -> None:
        self.pool = pool
        self.kv_cache = kv_cache
        self.fmt = fmt
        self.warm = warm
        self.cold_sink: ColdSink | None = None  # used when no writer is attached
        self.writer: ColdWriter | None = None
        self._lock = threading.Lock()  # _persisted: the writer forgets dropped writes from its thread
        self._meta: dict[BlockHash, tuple[BlockHash, tuple[int, ...]]] = {}  # indexed: parent, tokens
        self._persisted: set[BlockHash] = set()  # handed to the cold sink (or read from it)
        self.from_redis: set[BlockHash] = set()  # warm blocks that a prefetch brought from Redis
        self.spilled_blocks = 0
        self.resident = ResidentBlocks(warm)  # what other threads may ask of the pool and the warm tier
        pool.subscribe(self._on_event)  # first: a removed block is warm before resident forgets it
        pool.subscribe(self.resident.on_pool_event)

    def _on_event(self, event: BlockEvent) -> None:
        if isinstance(event, BlockStored):
            self._meta[event.block_hash] = (event.parent_hash, event.token_ids)
            # Exclusive tiers: the pool holds it now, and gives it back to the warm tier when it
            # evicts it. A copy kept warm meanwhile would take the room of a block only warm holds.
            self.warm.pop(event.block_hash)
        elif isinstance(event, BlockRemoved):
            meta = self._meta.pop(event.block_hash, None)
            if meta is None:
                return
            block = StoredBlock(event.block_hash, meta[0], meta[1], self.kv_cache.read_block(event.block_id))
            self.warm.put(block)
            self.spilled_blocks += 1
            fresh = self._claim([block.block_hash])
            if fresh and self.writer is not None:
                self.writer.enqueue([block], pinned=False)
            elif fresh and self.cold_sink is not None:
                self.cold_sink([block])
        elif isinstance(event, AllBlocksCleared):
            self._meta.clear()

    def attach(self, writer: ColdWriter) -> None:
        """Write to the cold tier through ``writer``; what it drops may be written again later."""
        self.writer = writer
        writer.on_drop = self.forget

    def _claim(self, hashes: Sequence[BlockHash]) -> set[BlockHash]:
        """The hashes not yet handed to the cold tier, marked as handed now."""
        if self.writer is None and self.cold_sink is None:
            return set()
        with self._lock:
            if len(self._persisted) > MAX_REMEMBERED_HASHES:
                self._persisted.clear()
            if len(self.from_redis) > MAX_REMEMBERED_HASHES:
                self.from_redis.clear()
            fresh = set(hashes) - self._persisted
            self._persisted |= fresh
        return fresh

    def admit(self, blocks: Sequence[StoredBlock], at_request: bool = True) -> None:
        """Blocks a prefetch brought from Redis: into the warm tier, known to be in Redis (but
        not those the pool indexed meanwhile: it holds them, and the tiers are exclusive). A
        request served from them counts them as Redis tokens, unless a warm start brought them
        (at_request False: loaded before the worker took work, they count as warm)."""
        for block in blocks:
            if block.block_hash not in self._meta:
                self.warm.put(block)
        hashes = [b.block_hash for b in blocks]
        self.resident.arrived(hashes)
        with self._lock:
            if at_request:
                self.from_redis.update(hashes)
            self._persisted.update(hashes)

    def admit_tail(self, tail: Tail, kept: KeptTails) -> None:
        """A session turn's partial last block a prefetch brought from Redis: into a pool block,
        kept as this worker's own tail would be (unless it keeps one under that parent)."""
        if not kept.holds(tail.parent):
            kept.make_room(1)
            got = self.pool.allocate(1)
            if got:
                self.kv_cache.write_block(got[0].block_id, tail.kv)
                got[0].num_tokens = len(tail.tokens)
                if not kept.adopt(tail.parent, got[0], tail.tokens):
                    self.pool.free(got)
        self.resident.on_tail(tail.parent, kept.holds(tail.parent))  # no longer on its way

    def mark_persisted(self, hashes: Sequence[BlockHash]) -> None:
        with self._lock:
            self._persisted.update(hashes)

    def forget(self, hashes: Sequence[BlockHash]) -> None:
        """Writes that never reached Redis (dropped, failed): a later spill may write them."""
        with self._lock:
            self._persisted.difference_update(hashes)

    def lookup(
        self, hashes: Sequence[BlockHash], token_ids: Sequence[int], first_block: int
    ) -> list[StoredBlock]:
        """The warm tier's run of blocks for hashes[0], hashes[1], ...: block i covers tokens
        [(first_block + i) * bs, ...). A block whose tokens differ ends the run."""
        run = self.warm.get_run(hashes)
        return run[: self._same_tokens(run, token_ids, first_block)]

    def peek_run(self, hashes: Sequence[BlockHash], token_ids: Sequence[int], first_block: int) -> int:
        """How many blocks lookup would return now, read without refreshing the warm tier's LRU
        order or counting hits and misses (the admission hold asks it at every step)."""
        return self._same_tokens(self.warm.peek_run(hashes), token_ids, first_block)

    def _same_tokens(self, run: Sequence[StoredBlock], token_ids: Sequence[int], first_block: int) -> int:
        """How many of run's blocks, from the first, hold the tokens they cover in token_ids."""
        bs = self.pool.block_size
        for i, block in enumerate(run):
            start = (first_block + i) * bs
            if tuple(token_ids[start : start + bs]) != block.token_ids:
                return i
        return len(run)

    def persist(
        self,
        block_ids: Sequence[int],
        hashes: Sequence[BlockHash],
        token_ids: Sequence[int],
        root: BlockHash,
        tail: tuple[int, BlockHash, tuple[int, ...]] | None = None,
    ) -> None:
        """A finished turn: its full blocks go to the cold tier (write-through) unless already there;
        and a session turn's partial last block (`tail`: its index in block_ids, its parent, its
        tokens) as a tail (kvstore/tiers/tail.py), so the worker its next turn moves to need not
        compute it.

        With a writer, the engine thread only copies the blocks into the writer's staging slots
        (they must be copied now: the pool may reuse their slots at the next step)."""
        bs = self.pool.block_size
        last = tail_hash(tail[1], tail[2]) if tail is not None else None
        fresh = self._claim([*hashes, *([last] if last is not None else [])])
        if not fresh:
            return
        picked: list[int] = []
        metas: list[BlockMeta] = []
        for i, (block_id, block_hash) in enumerate(zip(block_ids, hashes, strict=False)):
            if block_hash in fresh:
                parent = hashes[i - 1] if i else root
                picked.append(block_id)
                metas.append(BlockMeta(block_hash, parent, tuple(token_ids[i * bs : (i + 1) * bs])))
        if tail is not None and last in fresh:
            picked.append(block_ids[tail[0]])
            metas.append(BlockMeta(last, tail[1], padded(tail[2], bs), alone=True))
        if self.writer is not None:
            self.writer.stage(metas, self.kv_cache.by_block(), picked, pinned=True)
        elif self.cold_sink is not None:
            self.cold_sink(
                [
                    StoredBlock(m.block_hash, m.parent_hash, m.token_ids, self.kv_cache.read_block(b))
                    for m, b in zip(metas, picked, strict=True)
                ]
            )
