"""KVWriter: a thread that writes blocks to the Redis tier, so the engine thread never waits on
Redis, nor packs, checksums or converts KV.

The engine thread stages a finished turn (one copy of its blocks into a reused staging arena) or
enqueues spilled blocks it already holds as bytes; both calls take a lock for a few list
operations, never wait for the writer, and never fail for lack of room. The queue
(workers/tiers/write_queue.py) is bounded by bytes: when full, the oldest queued write not yet taken by
the writer is dropped (unpinned ones, spills, before a turn's write), counted, and its hashes go
to ``on_drop`` so a later spill may write them again. The writer coalesces everything queued (up
to ``max_batch_bytes``) into one RedisTier.put, which writes it in MULTI/EXECs of a few packs each
(redis_tier.TX_BYTES). Any exception from it (redis-py's cluster errors are not all RedisErrors)
drops the batch, counted in put_errors; a lost write costs a recompute later, never a wrong token.

Before each transaction the writer yields to a busy engine (workers/tiers/writer_yield.py).
``after_written`` orders work behind the writes queued so far without waiting for them (a turn's
session record, saved only once its blocks are in Redis): the writer then never yields.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from kvstore.chain import BlockHash
from kvstore.redis.client import KV_ERRORS
from kvstore.redis.tier import RedisTier
from kvstore.redis.write import PacksNotWritten
from kvstore.tiers.stored_block import StoredBlock
from workers.background import BackgroundThread
from workers.engine.kernels.omp_team import confine_to_this_thread
from workers.engine.tiers.pending_write import BlockMeta, PendingWrite
from workers.tiers.staging import StagingArena
from workers.tiers.write_queue import WriteQueue
from workers.tiers.writer_yield import EngineYield

log = logging.getLogger(__name__)
DEFAULT_QUEUE_BYTES = 256 * 1024**2  # ~4 turns of 1,300 tokens of SmolLM2-135M (fp32)
DEFAULT_BATCH_BYTES = 64 * 1024**2


@dataclass(frozen=True, slots=True)
class WriterStats:
    queued_writes: int
    queued_bytes: int
    capacity_bytes: int
    blocks_staged: int
    blocks_written: int
    batches: int
    writes_dropped: int  # queued writes dropped whole or in part: the queue was full
    blocks_dropped: int
    put_errors: int
    yields: int  # transactions that waited for the engine to go idle
    yielded_s: float  # how long those waited in all


class KVWriter:
    def __init__(
        self,
        tier: RedisTier,
        max_queued_bytes: int = DEFAULT_QUEUE_BYTES,
        max_batch_bytes: int = DEFAULT_BATCH_BYTES,
        pinned_memory: bool = False,
        on_drop: Callable[[list[BlockHash]], None] | None = None,
        defer_s: float = 0.0,
    ) -> None:
        self.tier = tier
        self.max_queued_bytes = max_queued_bytes
        self.max_batch_bytes = max_batch_bytes
        self.on_drop = on_drop
        self.yielding = EngineYield(defer_s)  # its ``idle``: EngineLoop.idle, set by the service
        self._flushing = 0  # threads in flush(): the writer then never yields
        capacity = max(1, max_queued_bytes // tier.fmt.nbytes)
        block_shape = tuple(tier.fmt.shape)
        self._arena = StagingArena(block_shape, tier.fmt.torch_dtype, capacity, pinned_memory)
        self._cond = threading.Condition()
        self._queue = WriteQueue(self._arena, max_queued_bytes)
        self._pending_drops: list[BlockHash] = []  # dropped under the lock, reported after it
        self._reported_drops = 0  # writes_dropped already added to the tier's shared counter
        self._counts = dict.fromkeys(
            ("blocks_staged", "blocks_written", "batches", "writes_dropped", "blocks_dropped", "put_errors"),
            0,
        )
        self.ready = threading.Event()  # set once the writer thread has set up and takes writes
        self._thread = BackgroundThread("kvferry-kv-writer", self._run)
        self._thread.start()  # assigned first: its body reads it

    @property
    def blocks_written(self) -> int:
        return self._counts["blocks_written"]

    # -- the engine thread's side: never waits ----------------------------------------------------

    def enqueue(self, blocks: Sequence[StoredBlock] | PendingWrite, pinned: bool = False) -> None:
        """Queue blocks whose bytes exist already (spills; callers outside the engine)."""
        item = blocks if isinstance(blocks, PendingWrite) else PendingWrite.of_blocks(blocks, pinned)
        if item.num_blocks:
            self._add(item)

    def stage(
        self,
        metas: Sequence[BlockMeta],
        pool_blocks: torch.Tensor,
        block_ids: Sequence[int],
        pinned: bool = True,
    ) -> int:
        """Copy blocks out of the pool into staging slots and queue them; returns how many were
        staged. pool_blocks: [num_blocks, layers, 2, block_size, kv_heads, head_dim], a view of the
        pool. What finds no room (the writer is busy with the rest) is dropped, a prefix kept."""
        with self._cond:
            slots = self._reserve(len(metas))
        dropped = [m.block_hash for m in metas[len(slots) :]]
        if dropped:
            self._count(writes_dropped=1, blocks_dropped=len(dropped))
        self._dropped(dropped)
        if not slots:
            return 0
        on_gpu = pool_blocks.device.type == "cuda"
        target = self._arena.tensor
        for slot, block_id in zip(slots, block_ids, strict=False):
            target[slot].copy_(pool_blocks[block_id], non_blocking=on_gpu)
        event = None
        if on_gpu:  # the writer waits for this, not the engine thread
            event = torch.cuda.Event()
            event.record()
        nbytes = len(slots) * self._arena.block_nbytes
        self._add(PendingWrite(tuple(metas[: len(slots)]), tuple(slots), (), pinned, event, nbytes))
        self._count(blocks_staged=len(slots))
        return len(slots)

    def _reserve(self, n: int) -> list[int]:
        """Up to n free staging slots, dropping queued staged writes (oldest first) to make room."""
        slots, dropped = self._queue.reserve(n)
        self._pending_drops += self._count_drops(dropped)
        return slots

    def _add(self, item: PendingWrite) -> None:
        with self._cond:
            dropped = self._count_drops(self._queue.push(item))
            due = self._queue.due_waiters()  # drops may have ended what some wait for
            self._cond.notify_all()
        self._dropped(dropped)
        self._call(due)

    def _count_drops(self, writes: list[PendingWrite]) -> list[BlockHash]:
        """Count writes the queue dropped (under the lock); returns their hashes."""
        self._counts["writes_dropped"] += len(writes)
        self._counts["blocks_dropped"] += sum(w.num_blocks for w in writes)
        return [h for w in writes for h in w.hashes]

    def _dropped(self, hashes: list[BlockHash]) -> None:
        with self._cond:
            hashes = [*self._pending_drops, *hashes]
            self._pending_drops = []
        if hashes and self.on_drop is not None:
            self.on_drop(hashes)

    # -- everyone's --------------------------------------------------------------------------------

    def mark(self) -> int:
        """The last write queued so far: what after_written(mark, ...) waits for."""
        with self._cond:
            return self._queue.next_seq - 1

    def pending(self) -> set[BlockHash]:
        """The hashes of the blocks queued or being written (not in Redis yet)."""
        with self._cond:
            return self._queue.pending_hashes()

    def after_written(self, mark: int, callback: Callable[[], None]) -> None:
        """Call ``callback`` once every write up to ``mark`` is in Redis (or was dropped): at once,
        on this thread, if they are; else on the writer's thread, so it must not block long."""
        with self._cond:
            self._queue.add_waiter(mark, callback)
            due = self._queue.due_waiters()
            self._cond.notify_all()
        self._call(due)

    def _call(self, callbacks: list[Callable[[], None]]) -> None:
        for callback in callbacks:
            try:
                callback()
            except Exception:  # a waiter's failure is its own: the writes go on
                log.exception("a callback ordered after KV writes failed")

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until everything queued so far is in Redis (or was dropped)."""
        with self._cond:
            target = self._queue.next_seq - 1
            self._flushing += 1
            try:
                return self._cond.wait_for(lambda: self._queue.oldest_pending() > target, timeout_s)
            finally:
                self._flushing -= 1

    def stop(self) -> None:
        """Write what is queued, then end the thread."""
        with self._cond:
            self._thread.stopping.set()
            self._cond.notify_all()
        self._thread.stop(join_s=30)

    def stats(self) -> WriterStats:
        with self._cond:
            return WriterStats(
                queued_writes=len(self._queue),
                queued_bytes=self._queue.queued_bytes,
                capacity_bytes=self.max_queued_bytes,
                yields=self.yielding.yields,
                yielded_s=self.yielding.yielded_s,
                **self._counts,
            )

    def _count(self, **deltas: int) -> None:
        with self._cond:
            for name, delta in deltas.items():
                self._counts[name] += delta

    # -- the writer thread ----------------------------------------------------------------------

    def _run(self) -> None:
        confine_to_this_thread()  # packing lossy tiers runs torch ops: no second OpenMP pool
        self._arena.touch()  # page faults here, not in the engine thread's first copy
        self.ready.set()
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._queue) or self._thread.stopped)
                if not self._queue:
                    return
                batch = self._queue.take(self.max_batch_bytes)
            self._write(batch)

    def _write(self, items: list[PendingWrite]) -> None:
        blocks: list[StoredBlock] = []
        for item in items:
            if item.copied is not None:
                item.copied.synchronize()
            if item.slots:  # zero-copy views of the staging slots: held until put returns
                rows = [self._arena.row(s) for s in item.slots]
                blocks += [
                    StoredBlock(m.block_hash, m.parent_hash, m.token_ids, r)
                    for m, r in zip(item.metas, rows, strict=True)
                ]
            else:
                blocks += item.ready
        alone = {m.block_hash for item in items for m in item.metas if m.alone}
        written, failed = 0, False
        deadline = self.yielding.deadline()
        try:
            wait = lambda: self.yielding.wait(deadline, self._hurried)  # noqa: E731
            written = self.tier.put(blocks, before_tx=wait, alone=alone)
        except KV_ERRORS as exc:  # Redis (or a cluster shard) away: no bug, no traceback
            failed = True
            what = "some" if isinstance(exc, PacksNotWritten) else "all"  # a shard down: the rest went in
            log.warning("writing %s of %d block(s) to Redis failed: %s", what, len(blocks), exc)
        except Exception:  # a lost write costs a recompute later, never a wrong token
            failed = True
            log.exception("writing %d block(s) to Redis failed", len(blocks))
        with self._cond:
            self._queue.finish()
            self._counts["blocks_written"] += written
            self._counts["batches"] += 1
            self._counts["put_errors"] += failed
            due = self._queue.due_waiters()
            self._cond.notify_all()
        if failed and self.on_drop is not None:
            self.on_drop([b.block_hash for b in blocks])
        self._call(due)
        self._report_drops()

    def _hurried(self) -> bool:
        """No yielding: the queue holds over half its bound, someone flushes or waits, or it stops."""
        with self._cond:
            full = self._queue.outstanding_bytes * 2 > self.max_queued_bytes
            return full or bool(self._flushing) or self._queue.waiting or self._thread.stopped

    def _report_drops(self) -> None:
        """Raise the tier's shared writes_dropped counter (for /metrics) by the drops since the
        last report. Best effort: a Redis that refuses it loses a count, never a block."""
        client = getattr(self.tier, "client", None)  # a RedisTier's; stand-ins in tests have none
        with self._cond:
            delta = self._counts["writes_dropped"] - self._reported_drops
            self._reported_drops += delta
        if delta and client is not None:
            try:
                client.hincrby(self.tier.keys.counters, "writes_dropped", delta)
            except Exception:
                log.warning("counting dropped writes in Redis failed", exc_info=True)
