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

import redis.asyncio as aioredis

from api.routing import cost as route_cost
from broker.messages import GenerateJob, SessionRecord
from broker.routing import prefetch_hint


async def hint(client: aioredis.Redis, worker: str, job: GenerateJob) -> None:
    """Tell `worker` the session's next turn is coming (one round trip)."""
    pipe = client.pipeline(transaction=False)
    prefetch_hint.queue(pipe, worker, prefetch_hint.for_job(job))
    await pipe.execute()


def move_target(
    job: GenerateJob, record: SessionRecord | None, move_after: int, worker: str, cost: Mapping[str, float]
) -> str:
    """At a session's turn K (move_after = K; `record` shows K-1 turns, or is None and K = 1), the
    turn going to `worker`: the worker its turn K+1 will move to, by the forced move's rule (the
    least `cost` of the others). "" at any other turn, or with no other worker."""
    done = record.turns if record is not None else 0
    if not job.session_id or move_after <= 0 or done != move_after - 1:
        return ""
    others = {n: c for n, c in cost.items() if n != worker}
    return route_cost.cheapest(others, {n: random.random() for n in others}) if others else ""
