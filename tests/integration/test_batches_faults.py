"""A batch across a worker SIGKILL, an api SIGKILL (its runner with it) and a restart of the queue
Redis: another api takes the runner's lease over, resumes from Redis and the part files, and the
batch completes with every custom_id exactly once, each line still equal to HF generate."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from ops.redis.server import RedisServer
from tests.integration.batches import ApiProcess, client, completion_line, read_lines, upload, wait_ended
from tests.integration.conftest import WorkerStarter, wait_for

LINES = 40
TOKENS = 16
CHECKED = 10  # lines compared with HF generate (each costs a generate)


def test_batch_survives_a_worker_sigkill_an_api_sigkill_and_a_redis_restart(
    tmp_path: Path, worker_factory: WorkerStarter, tokenizer: Any, tiny_reference: Any
) -> None:
    rng = random.Random(25)
    prompts = [[rng.randrange(100, 40000) for _ in range(rng.randrange(4, 24))] for _ in range(LINES)]
    with RedisServer(tmp_path / "redis", persist=True) as server:  # AOF: a restart keeps its data
        doomed, survivor = worker_factory.several(("bk1",), ("bk2",), redis_url=server.url)
        first = ApiProcess(server.url, tmp_path / "files", tmp_path / "api.log")
        second = None
        try:
            c = client(first.url)
            lines: list[dict[str, Any] | str] = [
                completion_line(f"k-{i}", p, TOKENS) for i, p in enumerate(prompts)
            ]
            batch = c.batches.create(
                input_file_id=upload(c, lines), endpoint="/v1/completions", completion_window="24h"
            )

            seen: list[int] = []

            def some_done() -> bool:
                counts = c.batches.retrieve(batch.id).request_counts
                seen.append(counts.completed if counts is not None else 0)
                return seen[-1] >= 5

            wait_for(some_done, 60, "the first lines")
            assert seen[-1] < LINES, "the batch ended before the faults: make it longer"
            doomed.kill()  # its running lines are redelivered to the other worker
            first.kill()  # the runner dies with it, mid-batch
            server.kill()
            server.start()  # same port, same data
            killed_at = time.monotonic()
            second = ApiProcess(server.url, tmp_path / "files", tmp_path / "api.log")
            c = client(second.url)
            done = wait_ended(c, batch.id, timeout_s=150)
            assert done.status == "completed", done
            assert time.monotonic() - killed_at < 150
            out = read_lines(c, done.output_file_id)
            ids = [line["custom_id"] for line in out]
            assert sorted(ids) == sorted(f"k-{i}" for i in range(LINES)), "every custom_id exactly once"
            assert done.error_file_id is None
            assert done.request_counts is not None and done.request_counts.completed == LINES
            for line in out[:CHECKED]:
                prompt = prompts[int(line["custom_id"].removeprefix("k-"))]
                want = str(tokenizer.decode(tiny_reference(prompt, TOKENS), skip_special_tokens=True))
                assert line["response"]["body"]["choices"][0]["text"] == want.rstrip("\ufffd")
        finally:
            first.stop()
            if second is not None:
                second.stop()
            survivor.stop()  # before its Redis goes
