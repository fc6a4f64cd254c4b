"""WriteQueue (workers/tiers/write_queue.py): a waiter's batch stops at its mark, so a write queued
after a turn is not hurried along with the turn's own writes."""

# ruff: noqa: F811

from __future__ import annotations

import torch

from tests.kvstore.conftest import MakeBlocks, make_blocks  # noqa: F401
from tests.workers.tiers.test_kv_writer import FMT
from workers.engine.tiers.pending_write import PendingWrite
from workers.tiers.staging import StagingArena
from workers.tiers.write_queue import WriteQueue


def _queue() -> WriteQueue:
    arena = StagingArena(tuple(FMT.shape), torch.float32, 4, pinned=False)
    return WriteQueue(arena, 1 << 30)


def test_a_waiters_batch_stops_at_its_mark_and_later_writes_wait(make_blocks: MakeBlocks) -> None:
    turn, spill, later = (PendingWrite.of_blocks(make_blocks(2, seed=s)) for s in (1, 2, 3))
    queue = _queue()
    queue.push(turn)
    queue.push(spill)
    called: list[str] = []
    queue.add_waiter(0, lambda: called.append("turn"))  # mark 0: the turn's write
    queue.push(later)
    assert queue.take(1 << 30) == [turn]  # not the writes queued after the mark
    queue.finish()
    assert [cb() for cb in queue.due_waiters()] == [None] and called == ["turn"]
    assert queue.take(1 << 30) == [spill, later]  # no waiter: one batch, as before


def test_with_no_waiter_a_batch_takes_what_fits(make_blocks: MakeBlocks) -> None:
    writes = [PendingWrite.of_blocks(make_blocks(1, seed=s)) for s in range(3)]
    queue = _queue()
    for write in writes:
        queue.push(write)
    assert queue.take(1 << 30) == writes
