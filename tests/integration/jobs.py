"""Jobs as the integration tests send them: straight to Celery, greedy, EOS ignored (the tiny
models' EOS means nothing), token-id prompts or chat messages."""

from __future__ import annotations

import random
import time
import uuid
from typing import Any

import redis

from broker import keys
from broker.codec import decode_result, encode_job
from broker.jobs import events as job_events
from broker.jobs.lease import JobLeases, Lease, LeaseHolder, Started, owner_worker
from broker.messages import ChatMessage, GenerateJob, GenerateResult, TokenDelta
from broker.sampling import SamplingParams
from broker.sessions import store as session_store
from kvstore.redis import pins as tier_pins
from kvstore.redis.keys import PinOwner, TierKeys
from tests.integration.conftest import MODEL, wait_for

BLOCK_SIZE = 16  # the workers' (the default)


def start_lease(leases: JobLeases, job_id: str, owner: str) -> Lease | LeaseHolder:
    """The lease a worker takes as it starts the job (JobLeases.start: listed in its job set), or
    who holds it."""
    got = leases.start(job_id, owner, keys.worker_jobs(owner_worker(owner)))
    return got.lease if isinstance(got, Started) else got


def token_job(prompt: list[int], max_tokens: int, model: str = MODEL) -> GenerateJob:
    return GenerateJob(
        model=model,
        prompt_token_ids=tuple(prompt),
        params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        submitted_at=time.time(),
    )


def send(app: Any, job: GenerateJob, queue: str = keys.SHARED_QUEUE) -> Any:
    """The task's AsyncResult (its id is the job id)."""
    return app.send_task(keys.GENERATE_TASK, args=[encode_job(job)], task_id=str(uuid.uuid4()), queue=queue)


def random_prompt(seed: int, n: int = 40) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 49152) for _ in range(n)]


def chat(
    app: Any, messages: list[dict[str, str]], session: str | None, queue: str, max_tokens: int = 8
) -> GenerateResult:
    """One chat turn (in `session`, if given) on `queue`, waited for."""
    job = GenerateJob(
        model=MODEL,
        endpoint="chat",
        messages=tuple(ChatMessage(m["role"], m["content"]) for m in messages),
        params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        session_id=session,
        submitted_at=time.time(),
    )
    return decode_result(send(app, job, queue).get(timeout=120))


def followed_tokens(client: redis.Redis, job_id: str) -> list[int]:
    """The job's tokens as a reader sees them (job_events.follow: each index once)."""
    events = job_events.follow(client, job_id, timeout_s=5)
    return [t for e in events if isinstance(e, TokenDelta) for t in e.token_ids]


def settled(client: redis.Redis, tenant: str, session: str) -> bool:
    """Whether the session's last turn has settled: its record names the whole chain and its pins
    are that turn's (workers/sessions/keeper.py does both just after the turn's answer)."""
    record = session_store.load(client, tenant, session)
    if record is None or len(record.block_hashes) < len(record.token_ids) // BLOCK_SIZE:
        return False
    owner = PinOwner.session(tenant, session)
    return any(
        o == owner and at == record.last_used
        for fp in tier_pins.fingerprints(client)
        for o, at in tier_pins.owners(client, TierKeys(fp))
    )


def wait_settled(client: redis.Redis, tenant: str, session: str, timeout_s: float = 10) -> None:
    wait_for(lambda: settled(client, tenant, session), timeout_s, f"session {session!r} to settle")
