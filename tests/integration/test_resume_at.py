"""A job handed back after a chosen number of streamed tokens, resumed on another worker: the
drain test's handback (test_drain.py) without its timing, at fixed tokens (mid-block, on a block
boundary, one token in, one token before the end). The resuming worker has the prompt's blocks in
Redis only (the first worker wrote them through) and computes the streamed tokens again; its
answer is HF greedy's, each token once, the streamed ones kept, its own under the next epoch."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import redis

from broker import keys
from broker.codec import decode_event, decode_result, encode_job
from broker.jobs import events as job_events
from broker.jobs.events import EVENT_FIELD
from broker.messages import GenerateResult, JobDone, TokenDelta
from tests.integration import near_tie
from tests.integration.conftest import WorkerProcess, WorkerStarter, stop_all
from tests.integration.jobs import BLOCK_SIZE, random_prompt, send, token_job, wait_settled

PROMPT, NEW = 45, 120  # the prompt's last block is partial: streamed tokens fill it, then others


def handed_back_at(
    app: Any, client: redis.Redis, tokenizer: Any, prompt: list[int], streamed: list[int], queue: str
) -> tuple[str, GenerateResult]:
    """The job as a first attempt left it: `streamed` on its stream under epoch 1 and no lease
    (lapsed), its message delivered again, to `queue`."""
    job_id = f"resume-at-{uuid.uuid4().hex[:8]}"
    client.set(keys.job_epoch(job_id), 1)
    job_events.publish(client, job_id, TokenDelta(tokenizer.decode(streamed), tuple(streamed), 0, 0, 1))
    task = app.send_task(
        keys.GENERATE_TASK, args=[encode_job(token_job(prompt, NEW))], task_id=job_id, queue=queue
    )
    return job_id, decode_result(task.get(timeout=120))


def deltas(client: redis.Redis, job_id: str) -> list[tuple[int, tuple[int, ...], int]]:
    """(start, tokens, epoch) of each delta on the raw stream, and its final event last."""
    entries: Any = client.xrange(keys.job_stream(job_id))
    events = [decode_event(fields[EVENT_FIELD]) for _, fields in entries]
    assert isinstance(events[-1], JobDone) and events[-1].epoch == 2
    return [(e.start, e.token_ids, e.epoch) for e in events if isinstance(e, TokenDelta)]


@pytest.fixture(scope="module")
def pair(start_worker: WorkerStarter) -> Iterator[tuple[WorkerProcess, WorkerProcess]]:
    a, b = start_worker.several(("resume-at-a",), ("resume-at-b",))
    yield a, b
    stop_all([a, b])


@pytest.mark.parametrize("k", [1, 7, BLOCK_SIZE * 4 - PROMPT, 77, NEW - 1])
def test_resumed_at_a_chosen_token_on_another_worker_is_hf_greedy_each_token_once(
    celery_app: Any,
    redis_client: redis.Redis,
    pair: tuple[WorkerProcess, WorkerProcess],
    tiny_hf: Any,
    tokenizer: Any,
    k: int,
) -> None:
    a, b = pair
    prompt = random_prompt(400 + k, PROMPT)
    session = f"resume-at-{uuid.uuid4().hex[:8]}"  # its turn settled: the blocks are in Redis
    first_job = msgspec.structs.replace(token_job(prompt, NEW), session_id=session)
    first = decode_result(send(celery_app, first_job, a.queue).get(timeout=120))
    assert first.worker == a.name
    wait_settled(redis_client, "", session)
    near_tie.check(tiny_hf, prompt, first.token_ids, "first attempt")
    streamed = list(first.token_ids[:k])
    job_id, res = handed_back_at(celery_app, redis_client, tokenizer, prompt, streamed, b.queue)
    assert res.worker == b.name and res.usage.completion_tokens == NEW
    full = len(prompt) // BLOCK_SIZE * BLOCK_SIZE
    assert res.usage.redis_tokens == full, res.usage  # the prompt's full blocks, written through by a
    assert res.usage.recomputed_tokens == len(prompt) + k - full, res.usage
    assert list(res.token_ids[:k]) == streamed
    ties = near_tie.check(tiny_hf, prompt, res.token_ids, f"resumed at {k}")
    print(f"\nresumed at {k}: near ties {ties}")
    written = deltas(redis_client, job_id)
    assert written[0] == (0, tuple(streamed), 1)
    assert all(epoch == 2 for _, _, epoch in written[1:])
    at = 0
    for start, tokens, _ in written:
        assert start == at, written
        at += len(tokens)
    assert at == NEW
    # b's pool holds that answer's blocks now: a second handback there reuses them past the prompt
    _, again = handed_back_at(celery_app, redis_client, tokenizer, prompt, streamed, b.queue)
    hits = again.usage.pool_tokens + again.usage.warm_tokens + again.usage.redis_tokens
    assert again.token_ids == res.token_ids and again.usage.cached_tokens == min(len(prompt), hits)
    assert hits == (len(prompt) + k - 1) // BLOCK_SIZE * BLOCK_SIZE, again.usage
    assert again.usage.recomputed_tokens == len(prompt) + k - hits, again.usage
