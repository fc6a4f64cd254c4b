"""Where a batch line's jobs go: to the worker the router picks (cache-aware: the one holding the
line's prefix) while that worker has free batch seats, else to the worker with the most free
seats. So lines fill every worker's seats, not the queue of the worker that holds a prefix they
share (beyond its seats they would wait in its engine while another worker's seats stand idle),
and each worker computes such a prefix once. A line's jobs all go to one worker: what its prompts
share is computed once there."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(slots=True)
class Room:
    """This pass's batch seats: the window (jobs, all workers) and each worker's free seats."""

    window: int
    free: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, window: int, seats: dict[str, int], running: Iterable[tuple[str | None, int]]) -> Room:
        """seats: each worker's batch window; running: (worker, jobs) of each line running now."""
        free = dict(seats)
        for worker, jobs in running:
            if worker in free:
                free[worker] -= jobs
        return cls(window, free)

    def place(self, preferred: str | None, jobs: int) -> str | None:
        """The worker for a line of `jobs` jobs (None: no worker says its seats), its seats taken."""
        if not self.free:
            return None
        if preferred in self.free and self.free[preferred] >= jobs:
            name = preferred
        else:
            name = max(sorted(self.free), key=lambda n: self.free[n])
        self.free[name] -= jobs
        return name
