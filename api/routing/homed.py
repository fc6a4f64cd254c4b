"""HomedSessions: the sessions between turns, by the worker their last turn ran on.

Cache-aware routing keeps a session on its worker, so a worker's load to come is not only the
rows it runs now but the sessions living there whose users are thinking: each comes back to it.
Placed by the rows alone, a new session goes to the worker whose sessions happen to be between
turns, and their next turns then share its steps. Round-robin never meets this: it sends every
turn to the next worker, so no worker keeps a session's load. So a session settling on a worker
(api/routing/cost.py, rows_to_come) counts them too.

A session counts from its turn's end (as this api saw it) until its next turn is routed, weighted
by how likely it is to be coming back: exp(-silence / the mean think time seen), where a think time
is the gap from a turn's end to its session's next turn. A session long silent has likely ended,
and the sessions that ended would otherwise keep new ones off the workers they lived on. A turn
whose end this api does not see (another api's, a job polled through /v1/jobs, one its client
abandoned) leaves its session uncounted: its worker's heartbeat shows it while it runs. Each api
process counts the sessions it routed (RoutingMemory)."""

from __future__ import annotations

import math
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from dataclasses import dataclass

THINK_EWMA = 0.1  # the weight of each think time seen in the mean
MIN_THINK_S = 0.5  # a floor for the mean: clients that send their next turn at once say little
FORGET_AFTER_MEANS = 6  # silent for six mean think times a session weighs under exp(-6): none


@dataclass(frozen=True, slots=True)
class _Turn:
    session: str
    worker: str


@dataclass(frozen=True, slots=True)
class _Ended:
    worker: str
    at: float


class HomedSessions:
    """Per api process (RoutingMemory): the turns routed and not yet seen ending, and the sessions
    between turns by worker. Bounded: at most `max_sessions` of each, and an ended session is
    kept for `horizon_s` or six mean think times, whichever is longer."""

    def __init__(
        self, horizon_s: float = 30.0, max_sessions: int = 65536, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.horizon_s = horizon_s
        self.max_sessions = max_sessions
        self.clock = clock
        self.think_s = horizon_s / 10  # the mean think time seen (exponentially weighted)
        self._running: dict[str, _Turn] = {}  # job id -> its turn, oldest first
        self._latest: dict[str, str] = {}  # session -> the job id of its latest turn, while running
        self._ended: OrderedDict[str, _Ended] = OrderedDict()  # session -> its last turn's end, oldest first

    def routed(self, session: str, worker: str, job_id: str) -> None:
        """A turn of `session` (route_cost.session_key; "" for none) went to `worker`."""
        if not session:
            return
        now = self.clock()
        self._trim(now)
        last = self._ended.pop(session, None)
        if last is not None:
            self.think_s = max(MIN_THINK_S, self.think_s + THINK_EWMA * (now - last.at - self.think_s))
        self._latest.pop(session, None)  # an earlier turn's end, seen late, changes nothing
        if job_id:
            self._running[job_id] = _Turn(session, worker)
            self._latest[session] = job_id
            while len(self._running) > self.max_sessions:
                oldest = next(iter(self._running))
                self._forget_turn(oldest, self._running.pop(oldest))

    def ended(self, job_id: str) -> None:
        """The api saw the job end: its session is between turns (a job of no session, or an
        older turn of a session whose next is routed already, changes nothing)."""
        turn = self._running.pop(job_id, None)
        if turn is None or self._latest.get(turn.session) != job_id:
            return
        del self._latest[turn.session]
        now = self.clock()
        self._ended.pop(turn.session, None)
        self._ended[turn.session] = _Ended(turn.worker, now)
        self._trim(now)

    def thinking(self, exclude: str = "") -> dict[str, float]:
        """Per worker, its sessions between turns (but `exclude`), each weighted
        exp(-silence / think_s)."""
        now = self.clock()
        self._trim(now)
        out = defaultdict[str, float](float)
        for session, e in reversed(self._ended.items()):  # the latest first: stop where weights vanish
            silence = now - e.at
            if silence > FORGET_AFTER_MEANS * self.think_s:
                break
            if session != exclude:
                out[e.worker] += math.exp(-silence / self.think_s)
        return dict(out)

    def _forget_turn(self, job_id: str, turn: _Turn) -> None:
        if self._latest.get(turn.session) == job_id:
            del self._latest[turn.session]

    def _trim(self, now: float) -> None:
        oldest = now - max(self.horizon_s, FORGET_AFTER_MEANS * self.think_s)
        ended = self._ended
        while ended:
            first = next(iter(ended.values()))
            if first.at >= oldest and len(ended) <= self.max_sessions:
                break
            ended.popitem(last=False)
