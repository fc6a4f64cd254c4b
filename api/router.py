"""Cache-aware routing: which queue a job goes to, and why (recorded in the job's metadata).

1. A session's next turn goes to the worker that served its last turn, when that worker's
   heartbeat is fresh and it is not overloaded (its blocks are there).
2. Otherwise, to the live worker advertising the longest run of the request's prefix digests
   (chat messages, or text chunks), the least loaded among equals.
3. Otherwise the shared queue: any worker takes it, and resumes from Redis what it lacks.

When a session's turn goes to a worker other than its last one (which is gone or busy), that
worker gets a prefetch hint first: it loads the session's blocks from the Redis tier into its
warm tier while the job waits in its queue (workers/tiers/prefetch.py).
"""

from __future__ import annotations

import bisect
import itertools
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from api import fleet
from broker import keys, prefetch_hint, prefix_index
from broker.messages import GenerateJob, SessionRecord, WorkerStatus
from broker.prefix_digest import chat_digests, text_digests
from broker.sessions import store as session_store


@dataclass(frozen=True, slots=True)
class Route:
    queue: str
    reason: str
    worker: str | None = field(default=None, compare=False)  # whose own queue; None: the shared one


class RecentRoutes:
    """Jobs this api process routed to each worker, with when: the part of a worker's load that
    its last heartbeat (up to a second old) cannot show yet. Without it, a burst of new sessions
    would all see the same stale loads and pile onto one worker."""

    def __init__(self, horizon_s: float = 30.0) -> None:
        self.horizon_s = horizon_s
        self._routes: dict[str, deque[float]] = {}  # per worker, in time order

    def add(self, worker: str) -> None:
        now = time.time()
        times = self._routes.setdefault(worker, deque())
        times.append(now)
        while times and times[0] < now - self.horizon_s:
            times.popleft()

    def since(self, worker: str, when: float) -> int:
        """Routed to `worker` after `when`: a binary search in its own times, whatever the others'."""
        times = self._routes.get(worker)
        return len(times) - bisect.bisect_right(times, when) if times else 0


_recent = RecentRoutes()


def _load(w: WorkerStatus) -> int:
    """Jobs running or waiting as of the heartbeat, plus those routed to it since."""
    return w.jobs_running + (w.engine.num_waiting if w.engine else 0) + _recent.since(w.name, w.sent_at)


def _to(worker: str, reason: str) -> Route:
    _recent.add(worker)
    return Route(keys.worker_queue(worker), reason, worker)


def _overloaded(w: WorkerStatus, max_waiting: int) -> bool:
    return w.engine is None or w.engine.num_waiting > max_waiting


def _digests(job: GenerateJob) -> list[str]:
    """Rooted in the job's tenant and cache salt, as the workers' are: a prefix another tenant
    (or salt) served never matches, so no route reason can tell of it."""
    if job.messages:
        return chat_digests(job.model, job.kv_salt, job.messages)
    if job.prompt:
        return text_digests(job.model, job.kv_salt, job.prompt)
    return []


_round_robin = itertools.count()


def _balanced(name: str, reason: str, loads: dict[str, int]) -> Route:
    """Where the blocks are, unless that worker is clearly busier than the least loaded one: then
    moving costs a fetch from Redis, which is cheaper than waiting (SGLang's router does alike)."""
    least = min(loads, key=lambda n: (loads[n], random.random()))
    if loads[name] - loads[least] > max(2, loads[least] // 4):
        return _to(least, f"load balance: {least} ({name} has {loads[name]} jobs, {least} {loads[least]})")
    return _to(name, reason)


async def _live(client: aioredis.Redis, cache: fleet.FleetCache | None) -> dict[str, WorkerStatus]:
    views = await (cache.workers(client) if cache is not None else fleet.workers(client))
    return {v.name: v.status for v in views if v.live and v.status is not None}


async def choose_queue(
    client: aioredis.Redis,
    job: GenerateJob,
    routing: str = "cache-aware",
    max_waiting: int = 8,
    prefetch_hints: bool = True,
    cache: fleet.FleetCache | None = None,
) -> Route:
    """`cache`: the api process's view of the fleet (read at most every cache.ttl_s); None reads
    it now. Either way a decision costs Redis one read per digest of the job, none per worker."""
    route, record = await _choose(client, job, routing, max_waiting, cache)
    if prefetch_hints and record is not None and route.worker and route.worker != record.last_worker:
        await send_hint(client, route.worker, job)
    return route


async def together(
    client: aioredis.Redis, route: Route, max_waiting: int = 8, cache: fleet.FleetCache | None = None
) -> Route:
    """A route for the jobs of one request (n choices, several prompts): one worker's queue, so
    what their prompts share is computed once there and the rest hit its blocks. The shared queue
    would let two workers each compute it: then the least loaded ready worker takes them all."""
    if route.worker is not None:
        return route
    live = (await _live(client, cache)).values()
    ready = {w.name: _load(w) for w in live if not _overloaded(w, max_waiting)}
    if not ready:
        return route
    name = min(ready, key=lambda n: (ready[n], random.random()))
    return _to(name, f"choices together: {name}, the least loaded ({route.reason})")


async def send_hint(client: aioredis.Redis, worker: str, job: GenerateJob) -> None:
    """One round trip: push, trim (bounded), expire (a dead worker's list goes away)."""
    assert job.session_id is not None
    hint = prefetch_hint.PrefetchHint(job.tenant, job.session_id, job.kv_salt)
    key = keys.worker_prefetch(worker)
    pipe = client.pipeline(transaction=False)
    pipe.lpush(key, prefetch_hint.encode(hint))
    pipe.ltrim(key, 0, prefetch_hint.MAX_PENDING - 1)
    pipe.expire(key, prefetch_hint.HINT_TTL_S)
    await pipe.execute()


async def _choose(
    client: aioredis.Redis, job: GenerateJob, routing: str, max_waiting: int, cache: fleet.FleetCache | None
) -> tuple[Route, SessionRecord | None]:
    """The route, and the session's record when the job continues a known session."""
    if routing == "shared":
        return Route(keys.SHARED_QUEUE, "shared: routing off"), None
    live = await _live(client, cache)
    if routing == "round-robin":
        if not live:
            return Route(keys.SHARED_QUEUE, "shared: no live worker"), None
        name = sorted(live)[next(_round_robin) % len(live)]
        return _to(name, f"round robin: {name}"), await _session(client, job)
    ready = {n: w for n, w in live.items() if not _overloaded(w, max_waiting)}
    loads = {n: _load(w) for n, w in ready.items()}
    note = ""
    record = await _session(client, job)
    if record is not None:
        if record.last_worker in ready:
            return _balanced(record.last_worker, f"session affinity: {record.last_worker}", loads), record
        state = "busy" if record.last_worker in live else "gone"
        note = f"; session's worker {record.last_worker} is {state}"
    digests = _digests(job)
    if digests and ready:
        matches = await prefix_index.matches(client, sorted(ready), digests)
        best = max(matches.values())
        if best > 0:
            tied = [n for n, m in matches.items() if m == best]
            name = min(tied, key=lambda n: (loads[n], random.random()))
            unit = "messages" if job.messages else "text chunks"
            route = _balanced(name, f"prefix match: {best}/{len(digests)} {unit} on {name}{note}", loads)
            return route, record
    reason = "shared: no live worker" if not live else "shared: no worker holds this prefix"
    return Route(keys.SHARED_QUEUE, reason + note), record


async def _session(client: aioredis.Redis, job: GenerateJob) -> SessionRecord | None:
    if not job.session_id:
        return None
    raw: Any = await client.get(keys.session(job.tenant, job.session_id))
    record = session_store.decode(raw) if raw is not None else None
    if record is None or record.tenant != job.tenant or record.model != job.model:
        return None
    return record
