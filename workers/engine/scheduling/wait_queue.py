"""WaitQueue: the scheduler's waiting sequences in the order they are served: interactive before
batch, then lower priority first (vLLM's), then arrival (broker/priority.py says why).

A new arrival goes behind every sequence of its rank or better; a sequence put back (preempted,
or deferred a step) goes ahead of every sequence of its rank, where it was. When every sequence
has one rank (all interactive, priority 0) this is exactly a FIFO with a front: append and
appendleft."""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from workers.engine.requests.sequence import EngineRequest


def rank(seq: EngineRequest) -> tuple[bool, int]:
    """The serving order's key (lower first): its class, then its priority."""
    return seq.job_class == "batch", seq.priority


class WaitQueue:
    def __init__(self) -> None:
        self._seqs: list[EngineRequest] = []

    def add(self, seq: EngineRequest) -> None:
        """A new arrival: behind every sequence of its rank or better."""
        if not self._seqs or rank(self._seqs[-1]) <= rank(seq):
            self._seqs.append(seq)  # the common case: one rank, O(1)
        else:
            self._seqs.insert(bisect.bisect_right(self._seqs, rank(seq), key=rank), seq)

    def put_back(self, seq: EngineRequest) -> None:
        """A sequence that was first among its rank (preempted, deferred): ahead of them again."""
        self._seqs.insert(bisect.bisect_left(self._seqs, rank(seq), key=rank), seq)

    def put_back_all(self, seqs: list[EngineRequest]) -> None:
        """Several, in their order (each was served before the next)."""
        for seq in reversed(seqs):
            self.put_back(seq)

    @property
    def first(self) -> EngineRequest:
        return self._seqs[0]

    def popleft(self) -> EngineRequest:
        return self._seqs.pop(0)

    def remove(self, seq: EngineRequest) -> None:
        self._seqs.remove(seq)

    def __contains__(self, seq: object) -> bool:
        return any(s is seq for s in self._seqs)

    def __iter__(self) -> Iterator[EngineRequest]:
        return iter(self._seqs)

    def __len__(self) -> int:
        return len(self._seqs)

    def __bool__(self) -> bool:
        return bool(self._seqs)
