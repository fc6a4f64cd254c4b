"""What `kvferry chaos` did to the stack, and when: the fault injector's log (ops/chaos/faults.py),
read by the report (ops/chaos/check.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class KillEvent:
    at: float  # time.monotonic() just before the SIGKILL
    child: str  # the stack's child name, e.g. "worker1"
    node: str  # its Celery node name, e.g. "w1@host"
    jobs: tuple[str, ...]  # the jobs it was running then
    back_after_s: float  # until its restarted process's heartbeat said ready


@dataclass(frozen=True, slots=True)
class FailoverEvent:
    at: float  # time.monotonic() just before the primary's SIGKILL
    promoted_after_s: float  # until the sentinels named the replica and it accepted a write
    old_primary: int  # its port
    new_primary: int


@dataclass(frozen=True, slots=True)
class KvShardKill:
    at: float  # time.monotonic() just before the shard's SIGKILL
    shard: int
    down_s: float  # until it was started again (empty: its packs are gone, read as misses)


@dataclass
class FaultLog:
    kills: list[KillEvent] = field(default_factory=list)
    redis_restarts: list[float] = field(default_factory=list)
    failovers: list[FailoverEvent] = field(default_factory=list)
    kv_shard_kills: list[KvShardKill] = field(default_factory=list)
    api_restarts: list[float] = field(default_factory=list)  # time.monotonic() of each SIGKILL
    # workers SIGTERMed (a scale-in: they drain, workers/process/drain.py), then started again;
    # back_after_s: from the SIGTERM to the process's exit
    scale_ins: list[KillEvent] = field(default_factory=list)
    drain_exit_codes: list[int | None] = field(default_factory=list)  # None: it did not exit in time
    unexpected_exits: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)  # "HH:MM:SS.mmm what", to read beside the logs

    def event(self, what: str) -> str:
        line = stamped(what)
        self.events.append(line)
        return line


def stamped(what: str) -> str:
    """The wall-clock time (as the workers' logs show it), then what happened."""
    now = time.time()
    return f"{time.strftime('%H:%M:%S', time.localtime(now))}.{int(now % 1 * 1000):03d} {what}"
