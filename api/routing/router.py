"""Cache-aware routing: which queue a job goes to, and why (recorded in the job's metadata).

1. Every ready worker (fresh heartbeat, not overloaded) gets an expected cost: the prefill left
   after its cache hit (a session's last worker holds its history; another, the longest run of
   the request's prefix digests it advertises; with the Redis tier the rest of what anyone served
   loads cheaper than it computes) plus the work ahead of the job there (api/routing/cost.py).
   The cheapest takes the job, unless the worker holding the most of the prompt costs at most
   MOVE_MARGIN more (SESSION_MOVE_MARGIN where that is the session's own worker, which it leaves
   only for one with room): then that one keeps it ("session affinity" or "prefix match"; a move
   is a "load balance"). With session_move_after_turns = K, a session's turn K+1 (with
   session_move_every_turns = M, every M-th turn after it too) goes to the cheapest worker other
   than its last one: the one chosen when turn K was routed (the job's prefetch_to,
   kept in the session record as next_worker), if still ready.
2. A session's turn with a prefix nobody holds: the least loaded ready worker.
3. Otherwise the shared queue: any worker takes it, and resumes from Redis what it lacks.

When a session's turn goes to a worker other than its last one, that worker gets a prefetch hint
first: it loads the session's blocks from the Redis tier into its warm tier while the job waits
in its queue (workers/tiers/prefetch.py). A forced move's worker is hinted earlier, by turn K's
worker as soon as turn K's blocks are written to Redis (workers/sessions/keeper.py): the think
time before turn K+1 hides the load, which the move's hint alone would add to its TTFT."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from api.routing import cost as route_cost
from api.routing import fleet
from api.routing import hints as route_hints
from api.routing.memory import RoutingMemory
from broker import keys
from broker.messages import GenerateJob, SessionRecord, WorkerStatus
from broker.routing import prefix_index
from broker.routing.prefix_digest import chat_digests, text_digests
from broker.sessions import store as session_store


@dataclass(frozen=True, slots=True)
class Route:
    queue: str
    reason: str
    worker: str | None = field(default=None, compare=False)  # whose own queue; None: the shared one
    prefetch_to: str = field(default="", compare=False)  # for the job's prefetch_to (GenerateJob)
    prefill_tokens: float = field(default=0.0, compare=False)  # expected there (api/routing/cost.py)


def _backlog(memory: RoutingMemory, w: WorkerStatus, session: str = "") -> route_cost.Backlog:
    """`session`: the job's (route_cost.session_key); its earlier turns count no prefill (and, seen
    ending, no job: Backlog.own_ended)."""
    return route_cost.backlog(w, memory.routes.since(w.name, w.sent_at, session))


def _to(worker: str, reason: str, prefetch_to: str = "", prefill_tokens: float = 0.0) -> Route:
    return Route(keys.worker_queue(worker), reason, worker, prefetch_to, prefill_tokens)


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
    move_after: int = 0,
    redis_tier: bool = True,
    job_id: str = "",
    *,
    memory: RoutingMemory,
    move_every: int = 0,
) -> Route:
    """`memory`: the api process's (api/context.py), told of this decision. `cache`: the api
    process's view of the fleet (read at most every cache.ttl_s); None reads it now. Either way a
    decision costs Redis one read per digest of the job, none per worker.
    `move_after`: session_move_after_turns (0: off), `move_every`: session_move_every_turns.
    `redis_tier`: whether the workers run the
    Redis tier (a prefix missing on a worker is then loaded, not computed). The route's
    prefetch_to is for the job's (api/intake.py sets it). `job_id`: the job's, for the memory's
    prefilled() and ended()."""
    move = route_hints.Move(move_after, move_every)
    route, record = await _choose(client, job, memory, routing, max_waiting, cache, move, redis_tier)
    if route.worker is not None:
        memory.routes.add(route.worker, route.prefill_tokens, route_cost.session_key(job), job_id)
        memory.homes.routed(route_cost.session_key(job), route.worker, job_id)
    if prefetch_hints and record is not None and route.worker and route.worker != record.last_worker:
        await route_hints.hint(client, route.worker, job)
    return route


async def together(
    client: aioredis.Redis,
    route: Route,
    max_waiting: int = 8,
    cache: fleet.FleetCache | None = None,
    *,
    memory: RoutingMemory,
) -> Route:
    """A route for the jobs of one request (n choices, several prompts): one worker's queue, so
    what their prompts share is computed once there and the rest hit its blocks. The shared queue
    would let two workers each compute it: then the least loaded ready worker takes them all."""
    if route.worker is not None:
        return route
    live = (await _live(client, cache)).values()
    ready = {w.name: _backlog(memory, w).sequences for w in live if not _overloaded(w, max_waiting)}
    if not ready:
        return route
    name = min(ready, key=lambda n: (ready[n], random.random()))
    memory.routes.add(name)
    return _to(name, f"choices together: {name}, the least loaded ({route.reason})")


async def _choose(
    client: aioredis.Redis,
    job: GenerateJob,
    memory: RoutingMemory,
    routing: str,
    max_waiting: int,
    cache: fleet.FleetCache | None,
    move: route_hints.Move,
    redis_tier: bool,
) -> tuple[Route, SessionRecord | None]:
    """The route, and the session's record when the job continues a known session."""
    if routing == "shared":
        return Route(keys.SHARED_QUEUE, "shared: routing off"), None
    live = await _live(client, cache)
    if routing == "round-robin":
        if not live:
            return Route(keys.SHARED_QUEUE, "shared: no live worker"), None
        name = sorted(live)[next(memory.turns) % len(live)]
        return _to(name, f"round robin: {name}"), await session_store.continued(client, job)
    ready = {n: w for n, w in live.items() if not _overloaded(w, max_waiting)}
    note = ""
    record = await session_store.continued(client, job)
    if record is not None and record.last_worker not in ready:
        state = "busy" if record.last_worker in live else "gone"
        note = f"; session's worker {record.last_worker} is {state}"
    digests = _digests(job)
    matches = await prefix_index.matches(client, sorted(ready), digests) if digests and ready else {}
    home_worker = record.last_worker if record is not None and record.last_worker in ready else None
    if ready and (home_worker is not None or max(matches.values(), default=0) > 0):
        unit = "messages" if job.messages else "text chunks"
        choice = _Choice(memory, job, ready, matches, record, home_worker, unit, len(digests))
        return choice.route(move, redis_tier, note), record
    if ready and job.session_id:
        return _first_turn(memory, job, ready, digests, record, redis_tier, note, move), record
    reason = "shared: no live worker" if not live else "shared: no worker holds this prefix"
    return Route(keys.SHARED_QUEUE, reason + note), record


def _first_turn(
    memory: RoutingMemory,
    job: GenerateJob,
    ready: dict[str, WorkerStatus],
    digests: list[str],
    record: SessionRecord | None,
    redis_tier: bool,
    note: str,
    move: route_hints.Move,
) -> Route:
    """A session stays where its first turn runs: that is placed by load, not left to the shared
    queue, whose first taker's prefetch would take a whole burst of new sessions. A prefix this api
    sent somewhere lately (a burst of sessions on a few system prompts) is not advertised before
    its job ends, yet is computed there by the time this job's turn comes: the same cost rule
    weighs it (with the Redis tier, as loadable elsewhere: it is written through once computed,
    so sessions on one prompt never pile on one worker)."""
    routed = memory.prefixes.runs(sorted(ready), digests)
    if max(routed.values(), default=0) > 0:
        unit = "messages" if job.messages else "text chunks"
        choice = _Choice(memory, job, ready, routed, record, None, unit, len(digests))
        route = choice.route(move, redis_tier, ", routed there lately" + note, force=False)
    else:
        to_come = _rows_to_come(memory, job, ready, None)
        backlogs = {
            n: _backlog(memory, w, route_cost.session_key(job)).cost + to_come[n] for n, w in ready.items()
        }
        name = min(backlogs, key=lambda n: (backlogs[n], random.random()))
        then = route_hints.move_target(job, record, move, name, backlogs)
        reason = f"least loaded: {name}, no worker holds this prefix{_between(to_come)}{note}"
        route = _to(name, reason, then, sum(route_cost.prompt_tokens(job)))
    if route.worker is not None:
        memory.prefixes.add(route.worker, digests)
    return route


def _rows_to_come(
    memory: RoutingMemory, job: GenerateJob, ready: dict[str, WorkerStatus], home_worker: str | None
) -> dict[str, float]:
    """For a session settling on a worker (a new one, or one whose worker is not ready): the rows
    the sessions between turns on each will bring back (api/routing/homed.py); else none."""
    if not job.session_id or home_worker is not None:
        return dict.fromkeys(ready, 0.0)
    thinking = memory.homes.thinking(exclude=route_cost.session_key(job))
    return route_cost.rows_to_come(thinking, ready)


def _between(to_come: dict[str, float]) -> str:
    if not any(to_come.values()):
        return ""
    return "; rows to come " + ", ".join(f"{n} {r:.0f}" for n, r in sorted(to_come.items()))


@dataclass(slots=True)
class _Choice:
    """One cache-aware decision among the ready workers, by expected cost (api/routing/cost.py)."""

    memory: RoutingMemory
    job: GenerateJob
    ready: dict[str, WorkerStatus]
    matches: dict[str, int]  # each worker's run of the job's prefix digests
    record: SessionRecord | None
    home_worker: str | None  # the session's last worker, when ready
    unit: str
    digests: int

    def route(self, move: route_hints.Move, redis_tier: bool, note: str, force: bool = True) -> Route:
        """The worker of least expected cost; the one holding the most of the prompt unless
        leaving it saves more than MOVE_MARGIN (SESSION_MOVE_MARGIN, and room there, for the
        session's own); another than the session's last worker when the session is due its
        forced move (`move`: after K turns, then every M; K = 0: never; `force`: whether to
        move now, else only choose turn K+1's worker at turn K)."""
        units = route_cost.prompt_tokens(self.job)
        total, record, home_worker = sum(units), self.record, self.home_worker
        history = route_cost.held_tokens(units, len(units) - 1) if record is not None else 0
        held = {n: route_cost.held_tokens(units, self.matches.get(n, 0)) for n in self.ready}
        if home_worker is not None:
            held[home_worker] = max(held[home_worker], history)
        loadable = max([history, *held.values()])
        prefill = {n: route_cost.prefill_cost(total, held[n], loadable, redis_tier) for n in self.ready}
        key = route_cost.session_key(self.job)  # its earlier turns have ended
        backlogs = {n: _backlog(self.memory, w, key) for n, w in self.ready.items()}
        if record is not None and home_worker is not None:
            # The session's last turn ended after its worker's heartbeat: that heartbeat still
            # counts it, which would push every session's next turn away from its blocks.
            backlogs[home_worker] = backlogs[home_worker].less_one_ended(
                record.last_used, self.ready[home_worker]
            )
        to_come = _rows_to_come(self.memory, self.job, self.ready, home_worker)
        cost = {n: prefill[n] + backlogs[n].cost + to_come[n] for n in self.ready}
        tiebreak = {n: random.random() for n in self.ready}
        home = min(self.ready, key=lambda n: (prefill[n], n != home_worker, backlogs[n].cost, tiebreak[n]))
        if force and record is not None and move.due(record.turns):
            others = {n: c for n, c in cost.items() if n != record.last_worker}
            if others:
                chosen = record.next_worker in others  # hinted after turn K: the blocks are warm there
                name = record.next_worker if chosen else route_cost.cheapest(others, tiebreak)
                reason = f"forced move after turn {record.turns}: {name} (from {record.last_worker})"
                return _to(name, reason, prefill_tokens=prefill[name])
            note += f"; no other worker to move to after turn {record.turns}"
        own = home == home_worker
        name = route_cost.cheapest(route_cost.destinations(cost, backlogs, home, own), tiebreak)
        if name == home or cost[home] - cost[name] <= route_cost.move_margin(own):
            then = route_hints.move_target(self.job, record, move, home, cost)
            if own:
                return _to(home, f"session affinity: {home}{note}", then, prefill[home])
            matched = f"{self.matches.get(home, 0)}/{self.digests} {self.unit}"
            return _to(home, f"prefix match: {matched} on {home}{note}", then, prefill[home])
        jobs = f"{home} has {backlogs[home].sequences} jobs, {name} {backlogs[name].sequences}"
        if backlogs[home].waiting or backlogs[name].waiting:
            jobs += f"; {backlogs[home].waiting} and {backlogs[name].waiting} waiting"
        if to_come[home] or to_come[name]:
            jobs += f"; rows to come {to_come[home]:.0f} and {to_come[name]:.0f}"
        return _to(
            name,
            f"load balance: {name} ({jobs}), expected cost {cost[home]:.0f} vs {cost[name]:.0f} "
            f"token equivalents{note}",
            route_hints.move_target(self.job, record, move, name, cost),
            prefill[name],
        )
