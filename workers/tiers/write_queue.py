"""WriteQueue: the KV writer's queue of pending writes, oldest first, bounded by bytes.

When full, the oldest queued write not yet taken by the writer is dropped, unpinned ones (spills)
before a turn's write, and its staging slots go back to the arena. Writes are numbered in queue
order; a waiter (a callback and a mark: the last number queued when it came) is due once every
write up to its mark is written or dropped. Not thread-safe: KVWriter holds its condition around
every call.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from kvstore.chain import BlockHash
from workers.engine.tiers.pending_write import PendingWrite
from workers.tiers.staging import StagingArena


class WriteQueue:
    def __init__(self, arena: StagingArena, max_bytes: int) -> None:
        self.arena = arena
        self.max_bytes = max_bytes
        self._entries: deque[tuple[int, PendingWrite]] = deque()  # (sequence number, write), oldest first
        self._in_flight: list[tuple[int, PendingWrite]] = []  # taken by the writer, not yet written
        self.next_seq = 0
        self.queued_bytes = 0  # of the writes not taken yet
        self._waiters: list[tuple[int, Callable[[], None]]] = []  # (mark, callback)

    def __len__(self) -> int:
        return len(self._entries)

    def push(self, item: PendingWrite) -> list[PendingWrite]:
        """Queue ``item``, then drop older writes while the queue is over its bytes; returns them."""
        self._entries.append((self.next_seq, item))
        self.next_seq += 1
        self.queued_bytes += item.nbytes
        dropped: list[PendingWrite] = []
        while self.queued_bytes > self.max_bytes and len(self._entries) > 1:
            victim = self._victim(lambda w: w is not item)
            if victim is None:
                break
            dropped.append(self._drop(victim))
        return dropped

    def reserve(self, n: int) -> tuple[list[int], list[PendingWrite]]:
        """Up to n free staging slots, dropping queued staged writes (oldest first) to make room:
        (the slots, the writes dropped)."""
        n = min(n, self.arena.capacity_blocks)
        dropped: list[PendingWrite] = []
        while self.arena.free_blocks < n:
            victim = self._victim(lambda w: bool(w.slots))
            if victim is None:
                break
            dropped.append(self._drop(victim))
        return self.arena.take(min(n, self.arena.free_blocks)) or [], dropped

    def take(self, max_batch_bytes: int) -> list[PendingWrite]:
        """The writer's next batch, oldest first: at least one write, more up to max_batch_bytes;
        while a waiter waits, none past the latest waiter's mark (the waiters hurry the writer, and
        a write queued after them must not be hurried along in their batch)."""
        batch_bytes = 0
        upto = max((mark for mark, _ in self._waiters), default=None)
        while self._entries and (not self._in_flight or batch_bytes < max_batch_bytes):
            if self._in_flight and upto is not None and self._entries[0][0] > upto:
                break
            entry = self._entries.popleft()
            self._in_flight.append(entry)
            batch_bytes += entry[1].nbytes
            self.queued_bytes -= entry[1].nbytes
        return [item for _, item in self._in_flight]

    def finish(self) -> None:
        """The batch taken is written (or failed): its staging slots are free again."""
        for _, item in self._in_flight:
            self.arena.give(list(item.slots))
        self._in_flight = []

    @property
    def outstanding_bytes(self) -> int:
        """Bytes queued or being written: what the queue's bound and the staging arena hold."""
        return self.queued_bytes + sum(item.nbytes for _, item in self._in_flight)

    def oldest_pending(self) -> int:
        """The sequence number of the oldest write not yet written; next_seq when there is none."""
        seqs = [s for s, _ in self._entries] + [s for s, _ in self._in_flight]
        return min(seqs, default=self.next_seq)

    def pending_hashes(self) -> set[BlockHash]:
        """The hashes of every write queued or being written."""
        return {h for _, w in (*self._entries, *self._in_flight) for h in w.hashes}

    def add_waiter(self, mark: int, callback: Callable[[], None]) -> None:
        self._waiters.append((mark, callback))

    @property
    def waiting(self) -> bool:
        return bool(self._waiters)

    def due_waiters(self) -> list[Callable[[], None]]:
        """The callbacks whose writes are all written or dropped, in the order they came; removed."""
        oldest = self.oldest_pending()
        due = [cb for mark, cb in self._waiters if mark < oldest]
        self._waiters = [(mark, cb) for mark, cb in self._waiters if mark >= oldest]
        return due

    def _victim(self, eligible: Callable[[PendingWrite], bool]) -> int | None:
        """The index of the oldest eligible queued write, unpinned ones first."""
        for want_pinned in (False, True):
            for i, (_, w) in enumerate(self._entries):
                if w.pinned == want_pinned and eligible(w):
                    return i
        return None

    def _drop(self, index: int) -> PendingWrite:
        _, item = self._entries[index]
        del self._entries[index]
        self.queued_bytes -= item.nbytes
        self.arena.give(list(item.slots))
        return item
