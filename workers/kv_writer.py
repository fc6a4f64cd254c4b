"""KVWriter: a thread that writes blocks to the Redis tier, so the engine thread never waits on
Redis. Write-through: a finished turn's blocks are queued here at once."""

from __future__ import annotations

import logging
import queue
import threading

from kvstore.redis_tier import RedisTier
from kvstore.stored_block import StoredBlock

log = logging.getLogger(__name__)


class KVWriter:
    def __init__(self, tier: RedisTier) -> None:
        self.tier = tier
        self._queue: queue.Queue[list[StoredBlock] | threading.Event | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="kvferry-kv-writer", daemon=True)
        self.blocks_written = 0
        self._thread.start()

    def enqueue(self, blocks: list[StoredBlock]) -> None:
        self._queue.put(blocks)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until everything queued so far is in Redis."""
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout_s)

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(30)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if isinstance(item, threading.Event):
                item.set()
                continue
            try:
                self.blocks_written += self.tier.put(item)
            except Exception:  # a lost write costs a recompute later, never a wrong token
                log.exception("writing %d block(s) to Redis failed", len(item))
