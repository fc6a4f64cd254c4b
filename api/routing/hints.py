"""The prefetch hints of routing: which worker is told to load a session's blocks ahead of its
turn, and when.

A session's turn sent to a worker other than its last one: the router hints that worker as it
queues the job, so the blocks load from the Redis tier while the job waits (hint()). That load
still lands on the turn's TTFT when the queue is short. A forced move (session_move_after_turns
= K) is known a turn ahead: routing turn K, the router chooses the worker turn K+1 will move to
(move_target()), the job carries it (GenerateJob.prefetch_to), and turn K's worker hints it as
soon as turn K's blocks are written to Redis (workers/sessions/keeper.py), so the history is warm
there during the think time before turn K+1."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

import redis.asyncio as aioredis

from api.routing import cost as route_cost
from broker.messages import GenerateJob, SessionRecord
from broker.routing import prefetch_hint


async def hint(client: aioredis.Redis, worker: str, job: GenerateJob) -> None:
    """Tell `worker` the session's next turn is coming (one round trip)."""
    pipe = client.pipeline(transaction=False)
    prefetch_hint.queue(pipe, worker, prefetch_hint.for_job(job))
    await pipe.execute()


@dataclass(frozen=True, slots=True)
class Move:
    """The forced move: session_move_after_turns = K (0: off) moves turn K+1 to another worker;
    session_move_every_turns = M (0: once) moves every M-th turn after it too (K+1, K+M+1, ...), a
    benchmark's setting (`kvferry bench responses`: K = M = 3: a conversation moves every other turn,
    and each moved turn is first sent as its baseline on the worker that kept the conversation)."""

    after: int = 0
    every: int = 0

    def due(self, turns_done: int) -> bool:
        """Whether the turn after `turns_done` turns moves."""
        if self.after <= 0 or turns_done < self.after:
            return False
        if self.every <= 0:
            return turns_done == self.after
        return (turns_done - self.after) % self.every == 0


def move_target(
    job: GenerateJob, record: SessionRecord | None, move: Move, worker: str, cost: Mapping[str, float]
) -> str:
    """At a session's turn K (a turn whose next one moves; `record` shows K-1 turns, or is None and
    K = 1), the turn going to `worker`: the worker its turn K+1 will move to, by the forced move's
    rule (the least `cost` of the others). "" at any other turn, or with no other worker."""
    done = record.turns if record is not None else 0
    if not job.session_id or not move.due(done + 1):
        return ""
    others = {n: c for n, c in cost.items() if n != worker}
    return route_cost.cheapest(others, {n: random.random() for n in others}) if others else ""
