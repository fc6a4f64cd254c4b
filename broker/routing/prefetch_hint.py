"""PrefetchHint: "this session's next turn is coming to you", pushed onto the worker's prefetch
list (keys.worker_prefetch), so that it loads the session's blocks from the Redis tier into its
warm tier before the turn needs them. The router pushes one when it sends a turn to a worker
other than the session's last (the job then waits in the queue while they load); with
session_move_after_turns = K, turn K's worker pushes one to the worker turn K+1 will move to as
soon as turn K's blocks are in Redis (workers/sessions/keeper.py), so they are warm there before
that turn comes. A hint is only advice: lost, late or wrong, it costs a fetch, never a token."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import redis
import redis.asyncio as aioredis

from broker import keys
from broker.messages import GenerateJob

log = logging.getLogger(__name__)

MAX_PENDING = 64  # hints a worker's list keeps (older ones are dropped: their turns ran already)
HINT_TTL_S = 60  # a list nobody drains (its worker died) goes away


@dataclass(frozen=True, slots=True)
class PrefetchHint:
    tenant: str
    session_id: str
    kv_salt: str  # the root of the session's block hashes (tenant and cache salt)


def for_job(job: GenerateJob) -> PrefetchHint:
    """The hint for a session's job (its next turn, or this one)."""
    assert job.session_id is not None
    return PrefetchHint(job.tenant, job.session_id, job.kv_salt)


def encode(hint: PrefetchHint) -> bytes:
    return json.dumps([hint.tenant, hint.session_id, hint.kv_salt]).encode()


def decode(raw: bytes | str) -> PrefetchHint | None:
    try:
        tenant, session_id, kv_salt = json.loads(raw)
    except (ValueError, TypeError):
        return None
    if not all(isinstance(v, str) for v in (tenant, session_id, kv_salt)):
        return None
    return PrefetchHint(tenant, session_id, kv_salt)


def queue(pipe: redis.client.Pipeline | aioredis.client.Pipeline, worker: str, hint: PrefetchHint) -> None:
    """Queue on `pipe` (either side's: queuing is the same) the push of `hint` onto `worker`'s
    list, trimmed (bounded) and expiring (a dead worker's list goes away)."""
    key = keys.worker_prefetch(worker)
    pipe.lpush(key, encode(hint))
    pipe.ltrim(key, 0, MAX_PENDING - 1)
    pipe.expire(key, HINT_TTL_S)


def send(client: redis.Redis, worker: str, hint: PrefetchHint) -> bool:
    """The sync side's push (a worker's), in one round trip; False when Redis failed it (logged:
    a hint lost costs the turn it announced a fetch, never the turn)."""
    pipe = client.pipeline(transaction=False)
    queue(pipe, worker, hint)
    try:
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("session %s: the prefetch hint to %s failed: %s", hint.session_id, worker, exc)
        return False
    return True
