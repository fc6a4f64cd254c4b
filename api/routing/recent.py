"""What this api routed lately, for cache-aware routing (api/routing/router.py, api/routing/cost.py): the jobs
routed to each worker, with when, the prefill expected of them there, and when the api saw each
one's first token and its end (RecentRoutes); and the prefixes of the session first turns routed
lately (RoutedPrefixes). Both are what a worker's heartbeat (sent every second, read through a fleet
cache of a second) cannot show yet."""

from __future__ import annotations

import bisect
import itertools
import time
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter


@dataclass(frozen=True, slots=True)
class Routed:
    """Jobs routed to a worker over some time, and the prefill the router expected of them there;
    and of those routed before that time, how many ended since, and the prefill expected of those
    prefilled since (the worker's heartbeat of that time still counts them)."""

    jobs: int = 0
    prefill_tokens: float = 0.0
    gone: int = 0
    prefill_done: float = 0.0
    own_ended: bool = False  # a turn of the session being routed was seen ending, and is counted off


@dataclass(slots=True)
class _Route:
    at: float
    prefill_tokens: float
    session: str  # route_cost.session_key of its job ("" for none)
    job_id: str
    worker: str
    prefilled_at: float = 0.0  # 0: not seen yet
    ended_at: float = 0.0

    @property
    def prefilled(self) -> bool:
        return self.prefilled_at > 0.0


class RecentRoutes:
    """Jobs this api process routed to each worker, with when and their expected prefill: the part
    of a worker's load that its last heartbeat (a second old, read through a fleet cache of another)
    cannot show yet. Without it, a burst of new sessions would all see the same stale loads and
    pile onto one worker. A job's
    prefill stops counting once it is done: prefilled() (the api saw its first token or its end),
    or its session's next turn is being routed (`ended`). Its seat stops counting at ended().
    The same holds the other way: a job the heartbeat counts but this api saw prefill or end
    since counts no more.

    Bounded: what is older than the horizon is dropped from every worker (a worker routed to no
    more, gone from the fleet, keeps nothing), and at most `max_routes` per worker are kept."""

    def __init__(self, horizon_s: float = 30.0, max_routes: int = 65536) -> None:
        self.horizon_s = horizon_s
        self.max_routes = max_routes
        self._trimmed = 0.0  # when every worker was last trimmed
        self._routes: dict[str, deque[_Route]] = {}  # per worker, in time order
        self._prefills: dict[str, deque[_Route]] = {}  # per worker, in the order they prefilled
        self._ends: dict[str, deque[_Route]] = {}  # per worker, in the order they ended
        self._by_job: dict[str, _Route] = {}  # the same routes, by job id where one was given

    def add(self, worker: str, prefill_tokens: float = 0.0, session: str = "", job_id: str = "") -> None:
        now = time.time()
        routes = self._routes.setdefault(worker, deque())
        route = _Route(now, prefill_tokens, session, job_id, worker)
        routes.append(route)
        if job_id:
            self._by_job[job_id] = route
        oldest = now - self.horizon_s
        while routes and (routes[0].at < oldest or len(routes) > self.max_routes):
            self._by_job.pop(routes.popleft().job_id, None)
        _trim(self._prefills.get(worker), "prefilled_at", oldest)
        _trim(self._ends.get(worker), "ended_at", oldest)
        if now - self._trimmed >= min(1.0, self.horizon_s):
            self._trim_all(oldest)
            self._trimmed = now

    def _trim_all(self, oldest: float) -> None:
        for worker in list(self._routes):
            routes = self._routes[worker]
            while routes and routes[0].at < oldest:
                self._by_job.pop(routes.popleft().job_id, None)
            _trim(self._prefills.get(worker), "prefilled_at", oldest)
            _trim(self._ends.get(worker), "ended_at", oldest)
            if not (routes or self._prefills.get(worker) or self._ends.get(worker)):
                del self._routes[worker]
                self._prefills.pop(worker, None)
                self._ends.pop(worker, None)

    def prefilled(self, job_id: str) -> None:
        """A job this api did not route here (or forgot, past the horizon) changes nothing."""
        route = self._by_job.get(job_id)
        if route is not None and not route.prefilled:
            route.prefilled_at = time.time()
            self._prefills.setdefault(route.worker, deque()).append(route)

    def ended(self, job_id: str) -> None:
        """The api saw the job end: it holds no seat on its worker any more."""
        self.prefilled(job_id)
        route = self._by_job.get(job_id)
        if route is not None and not route.ended_at:
            route.ended_at = time.time()
            self._ends.setdefault(route.worker, deque()).append(route)

    def since(self, worker: str, when: float, ended: str = "") -> Routed:
        """Routed to `worker` after `when`: a binary search in its own times, whatever the others'.
        A job whose prefill is done counts no tokens, and one that has ended no job either.
        `ended`: a session whose routed turns have all ended (its next is being routed): its turns'
        prefill counts no more even before the api sees their first token. Of those routed by
        `when`: the ones that had their first token by then (so the heartbeat of `when` counted
        them) and ended since, and the expected prefill of the ones prefilled since (the heartbeat
        counted it if they were in the engine by then; a guess, floored at none left)."""
        routes = self._routes.get(worker)
        if not routes:
            return Routed()
        first = bisect.bisect_right(routes, when, key=lambda r: r.at)
        jobs, pending, own_ended = 0, 0.0, False
        for r in itertools.islice(routes, first, None):
            own = bool(ended) and r.session == ended
            jobs += not r.ended_at
            own_ended = own_ended or (own and bool(r.ended_at))
            pending += r.prefill_tokens if not (r.prefilled or own) else 0.0
        gone = 0
        for r in _after(self._ends.get(worker), when, "ended_at"):
            if r.at <= when and 0.0 < r.prefilled_at <= when:
                gone += 1
                own_ended = own_ended or (bool(ended) and r.session == ended)
        done = sum(
            r.prefill_tokens for r in _after(self._prefills.get(worker), when, "prefilled_at") if r.at <= when
        )
        return Routed(jobs, pending, gone, done, own_ended)


def _trim(events: deque[_Route] | None, field: str, oldest: float) -> None:
    while events and getattr(events[0], field) < oldest:
        events.popleft()


def _after(events: deque[_Route] | None, when: float, field: str) -> Iterator[_Route]:
    """The events (in the order of `field`'s time) after `when`."""
    if not events:
        return iter(())
    first = bisect.bisect_right(events, when, key=attrgetter(field))
    return itertools.islice(events, first, None)


class RoutedPrefixes:
    """The prefix digests of the session first turns this api routed lately, each with the worker
    it went to (the latest): a prefix under computation there, not advertised until its job ends."""

    def __init__(self, horizon_s: float = 30.0, max_digests: int = 4096) -> None:
        self.horizon_s = horizon_s
        self.max_digests = max_digests
        self._where: OrderedDict[str, tuple[str, float]] = OrderedDict()  # digest -> (worker, when)

    def add(self, worker: str, digests: Sequence[str]) -> None:
        now = time.time()
        for digest in digests:
            self._where[digest] = (worker, now)
            self._where.move_to_end(digest)
        while len(self._where) > self.max_digests:
            self._where.popitem(last=False)

    def runs(self, candidates: Sequence[str], digests: Sequence[str]) -> dict[str, int]:
        """For each candidate, how many of `digests` from the first on were routed to it lately."""
        oldest = time.time() - self.horizon_s
        out = dict.fromkeys(candidates, 0)
        first = ""
        for digest in digests:
            worker, when = self._where.get(digest, ("", 0.0))
            if worker not in out or when < oldest or worker != (first or worker):
                break
            first = worker
            out[worker] += 1
        return out
