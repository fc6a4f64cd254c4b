"""InFlight: the blocks a prefetch on this worker is reading from Redis right now.

A routing hint's prefetch (workers/tiers/prefetch.py HintListener) and the moved turn's own prefetch
often run at once: the turn reaches an idle worker while the hint's read is still on the wire, and
ResidentBlocks knows of the hint's blocks only once they are fetched. Both read the same packs then,
and one copy is waste. A prefetch claims the blocks it is about to read; a second one that needs the
first of them waits for that read to land (its blocks are then resident, or expected) and reads only
what is still missing. The wait is bounded: a stuck read costs the other a redundant fetch, never
a stall."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from kvstore.chain import BlockHash

WAIT_S = 5.0


class InFlight:
    def __init__(self, wait_s: float = WAIT_S) -> None:
        self.wait_s = wait_s
        self._lock = threading.Lock()
        self._reading: dict[BlockHash, threading.Event] = {}
        self.waits = 0  # prefetches that waited for another's read of their first missing block

    @contextmanager
    def claim(self, hashes: Sequence[BlockHash]) -> Iterator[None]:
        """Mark `hashes` (a run about to be read, its first block first) as being read by this
        thread until the block exits; before that, wait while another thread reads hashes[0]."""
        if not hashes:
            yield
            return
        done = threading.Event()
        while True:
            with self._lock:
                busy = self._reading.get(hashes[0])
                if busy is None:
                    for h in hashes:
                        self._reading.setdefault(h, done)
                    break
                self.waits += 1
            if not busy.wait(self.wait_s):
                break  # read on unclaimed: a redundant fetch at worst
        try:
            yield
        finally:
            with self._lock:
                for h in hashes:
                    if self._reading.get(h) is done:
                        del self._reading[h]
            done.set()

    def __len__(self) -> int:
        with self._lock:
            return len(self._reading)
