"""The scaling policy: how many workers the fleet should have. Pure (no I/O, no clock of its own):
the api evaluates it at every scrape of /metrics (kvferry_desired_workers), KEDA scales the
workers' Deployment on that gauge, and `kvferry serve --autoscale` follows the same gauge.

    demand     = jobs running + jobs waiting (every band's messages, parked, admitted-not-started)
    ahead      = demand + growth x growth_lead_s + spare_seats
    per_worker = seats the live workers can fill now (pool_room, summed) / workers
    by_seats   = ceil(ahead / (per_worker x target_seat_use))
    by_wait    = workers + 1   while the wait p95 or an engine's longest wait is over its target
                               and jobs wait
    raw        = clamp(max(by_seats, by_wait), min_workers, max_workers)   (min_workers when idle)

Room (pool_room): a worker runs at most its seats (max_num_seqs), and at most what its KV pool
holds. The pool's bound is read from the heartbeat as the running sequences' mean blocks into the
whole pool: running x blocks_total / blocks they hold (kept session tails left out: they are given
back first when the pool runs short). A worker whose pool is full therefore counts as full at the
sequences it runs; one whose sequences are short counts its seats (the smaller of the two). The
figure moves with the pool's use, not with whether a sequence waits at this instant, so a fleet
sized on a pool-bound load keeps its size once the load is spread (nothing waits any more, but each
pool is still as full per sequence) instead of flapping. Where no pool is the bound this is the
seat count, as before.

`growth`: how fast demand rose over the last few seconds (jobs/s; a fall counts as 0). A worker
asked for now takes seats only after a scrape and its start (~10 s), and a burst's first jobs
would wait for it; so the fleet is sized for the demand `growth_lead_s` ahead at the present
growth, plus `spare_seats` free seats (the first jobs of a burst start at once). Both cost
worker-seconds while calm: kvferry bench autoscale weighs them (docs/benchmarks.md). Both are 0
(off) here; the settings turn them on (broker/defaults.py).

Lateness: the queue wait p95 (up to a job's task start, api/scale/wait_window.py) misses the wait
a job then spends inside its worker's engine for a seat or pool room, and a job still waiting is
in no p95 yet. So the wait the policy reads is the larger of that p95 and the longest wait, right
now, of a sequence not yet started in any engine (the heartbeat's oldest_waiting_s, as old as the
heartbeat). A preempted sequence's stall is not in it (its stream has begun): the room covers it.

Hysteresis (Hysteresis.update): a raw figure above the current one is taken at once (a burst
pays no delay); one below it only once every raw figure for `scale_in_hold_s` was below it, and
nothing waits or the wait is under half its target; then the highest of those figures (never below what
the recent past needed). Between the two thresholds (target_seat_use for scale-out, the hold and
the wait for scale-in) the figure stays where it is, so a load at the edge does not flap."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

GROWTH_WINDOW_S = 5.0  # demand's growth is measured over at least this long (Hysteresis._growth)


@dataclass(frozen=True, slots=True)
class ScalePolicy:
    min_workers: int = 1
    max_workers: int = 8
    wait_target_s: float = 2.0  # the wait (FleetLoad.wait_s) the fleet should keep under
    target_seat_use: float = 0.8  # the share of seats demand should fill at the desired size
    scale_in_hold_s: float = 30.0  # how long a lower figure must hold before workers go
    default_seats: int = 8  # per worker, while no live worker says its seats
    spare_seats: int = 0  # free seats kept beyond demand (module docstring)
    growth_lead_s: float = 0.0  # demand is projected this far ahead at its present growth

    def __post_init__(self) -> None:
        if not 0 <= self.min_workers <= self.max_workers or self.max_workers < 1:
            raise ValueError("need 0 <= min_workers <= max_workers and max_workers >= 1")
        if not 0 < self.target_seat_use <= 1:
            raise ValueError("target_seat_use must be in (0, 1]")
        if self.wait_target_s <= 0 or self.scale_in_hold_s < 0 or self.default_seats < 1:
            raise ValueError("wait_target_s and default_seats must be positive, scale_in_hold_s >= 0")
        if self.spare_seats < 0 or self.growth_lead_s < 0:
            raise ValueError("spare_seats and growth_lead_s must be >= 0")


@dataclass(frozen=True, slots=True)
class FleetLoad:
    """What the policy reads: fleet-wide figures of one moment."""

    workers: int  # live workers (loading ones included: they will take seats soon)
    seats_total: int  # engine seats of the live workers that say theirs
    jobs_running: int  # seats in use
    jobs_waiting: int  # everything a new worker would help with
    wait_p95_s: float | None  # queue wait p95 of the recent jobs; None: none started lately
    seats_usable: float | None = None  # pool_room summed over the live workers; None: seats_total
    engine_wait_s: float = 0.0  # the longest wait now of a sequence not started in any engine

    @property
    def wait_s(self) -> float | None:
        """The wait the policy reads: the queue wait p95 or an engine's longest wait, the larger."""
        if self.wait_p95_s is None and self.engine_wait_s <= 0:
            return None
        return max(self.wait_p95_s or 0.0, self.engine_wait_s)


def pool_room(seats: int, running: int, blocks_total: int, blocks_held: int) -> float:
    """Sequences one worker can run at once now (module docstring): its seats, or fewer when its
    KV pool fits fewer sequences like its running ones (blocks_held: the blocks they hold)."""
    if running <= 0 or blocks_held <= 0 or blocks_total <= 0:
        return float(seats)
    return min(float(seats), running * blocks_total / blocks_held)


def raw_desired(policy: ScalePolicy, load: FleetLoad, growth_per_s: float = 0.0) -> int:
    """The size this moment (and demand's growth up to it, jobs/s) asks for (no hysteresis)."""
    demand = load.jobs_running + load.jobs_waiting
    if demand == 0:
        return policy.min_workers
    usable = load.seats_total if load.seats_usable is None else load.seats_usable
    per_worker = usable / load.workers if load.workers and usable > 0 else policy.default_seats
    ahead = demand + max(0.0, growth_per_s) * policy.growth_lead_s + policy.spare_seats
    wanted = math.ceil(ahead / (per_worker * policy.target_seat_use))
    wait = load.wait_s
    if wait is not None and wait > policy.wait_target_s and load.jobs_waiting > 0:
        wanted = max(wanted, load.workers + 1)
    return min(max(wanted, policy.min_workers), policy.max_workers)


@dataclass
class Hysteresis:
    """The desired size over time: up at once, down only after a hold (module docstring)."""

    policy: ScalePolicy
    desired: int | None = None
    _low_since: float | None = None
    _low_peak: int = 0  # the highest raw figure seen during the hold
    _seen: deque[tuple[float, int]] = field(default_factory=deque)  # (when, demand), oldest first

    def update(self, load: FleetLoad, now: float) -> int:
        raw = raw_desired(self.policy, load, self._growth(load.jobs_running + load.jobs_waiting, now))
        if self.desired is None or raw >= self.desired:
            if self.desired is None or raw > self.desired:
                self.desired = raw
            self._low_since = None
            return self.desired
        if self._low_since is None:
            self._low_since, self._low_peak = now, raw
        self._low_peak = max(self._low_peak, raw)
        # nothing waits: the window's p95 (finished jobs of the past minute) is history
        late = load.wait_s is not None and load.wait_s >= self.policy.wait_target_s / 2
        calm = load.jobs_waiting == 0 or not late
        if calm and now - self._low_since >= self.policy.scale_in_hold_s:
            self.desired, self._low_since = self._low_peak, None
        return self.desired

    def _growth(self, demand: int, now: float) -> float:
        """Demand's growth (jobs/s) since the latest update at least GROWTH_WINDOW_S ago (else
        the oldest): over a few seconds, so one scrape's Poisson noise does not scale the fleet."""
        while len(self._seen) > 1 and self._seen[1][0] <= now - GROWTH_WINDOW_S:
            self._seen.popleft()
        growth = 0.0
        if self._seen and now > self._seen[0][0]:
            growth = (demand - self._seen[0][1]) / (now - self._seen[0][0])
        self._seen.append((now, demand))
        return growth
