"""The batch window in seats (jobs), against a real redis-server and the api's own batch runner:
a line that fans out to n choices takes n seats, and a worker whose concurrency is at or below
the dispatch headroom still gives batches a seat."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import redis
from openai import OpenAI

from api.dispatch.capacity import seats
from api.jobs.client import JobClient
from broker import keys, priority
from tests.api.conftest import Served
from tests.api.test_dispatch import MODEL, beat, run


def test_a_worker_at_or_below_the_headroom_still_gives_batches_a_seat(
    private: tuple[redis.Redis, str],
) -> None:
    rds, redis_url = private

    async def body(client: JobClient) -> list[tuple[int, int]]:
        ctx: Any = SimpleNamespace(jobs=client, config=SimpleNamespace(dispatch_headroom=4))
        beat(rds, "w1@test", 4)  # concurrency == headroom
        beat(rds, "w2@test", 2)  # below it
        client.fleet.ttl_s = 0
        got = await seats(ctx)
        busy = await seats(ctx, batch_running=2)
        return [(got.window, got.free), (busy.window, busy.free)]

    assert run(redis_url, body) == [(2, 2), (2, 0)]  # one seat a worker


def _line(custom_id: str, n: int) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 2, "n": n, "temperature": 1.0}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": body}


def _queued(rds: redis.Redis, queue: str = keys.worker_queue("w1@test")) -> int:
    return int(rds.llen(priority.queue_key(queue, priority.band("batch", 0))))


def test_a_fanned_out_line_takes_a_seat_per_job(serve: Callable[..., Served], rds: redis.Redis) -> None:
    """Window 4 (concurrency 6, headroom 2), no worker taking jobs: lines of n=3 are fed one at a
    time (3 seats, then 1 left: too few for the next), not four lines (12 jobs) as lines would."""
    api = serve(dispatch_headroom=2)
    beat(rds, "w1@test", 6)
    client = OpenAI(base_url=f"{api.url}/v1", api_key="none", max_retries=0, timeout=30)
    data = "\n".join(json.dumps(_line(f"l-{i}", 3)) for i in range(4)).encode()
    uploaded = client.files.create(file=("fan.jsonl", data), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 10
    while _queued(rds) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # several runner passes: none may feed more
    assert rds.hlen(keys.batch_running(batch.id)) == 1
    assert _queued(rds) == 3 and _queued(rds, keys.SHARED_QUEUE) == 0  # placed on the worker's seats
    client.batches.cancel(batch.id)
