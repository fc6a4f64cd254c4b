"""The Batch API through a real stack (redis-server, real workers, the api as a process) with the
`openai` client unchanged: upload, create, poll, download; every greedy line equals HF generate;
bad lines in the error file; another tenant's batch is a 404; cancel; expiry."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from ops.redis.server import RedisServer
from tests.integration.batches import batch_api, client, completion_line, read_lines, upload, wait_ended
from tests.integration.conftest import MODEL, WorkerStarter, stop_all

Reference = Callable[[list[int], int], list[int]]


@pytest.fixture(scope="module")
def where(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("batch-api")


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A queue Redis of this module's own: the batch runner is one api's of all on a Redis, and
    these tests read its figures from their own api's /metrics."""
    with RedisServer(tmp_path_factory.mktemp("batch-redis")) as server:
        yield server


@pytest.fixture(scope="module")
def api(start_worker: WorkerStarter, own_redis: RedisServer, where: Path) -> Iterator[str]:
    workers = start_worker.several(("bw1",), ("bw2",), redis_url=own_redis.url)
    try:
        yield from batch_api(own_redis.url, where / "files", where / "api.log")
    finally:
        stop_all(workers)


def _text(tokenizer: Any, ids: list[int]) -> str:
    """HF's tokens as the api's text: a trailing incomplete UTF-8 character is held back."""
    return str(tokenizer.decode(ids, skip_special_tokens=True)).rstrip("\ufffd")


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 40000) for _ in range(rng.randrange(4, 20))] for _ in range(n)]


@pytest.mark.fp32_only(reason="every greedy line's text equals HF fp32 generate's")
def test_batch_lines_equal_hf_and_bad_lines_go_to_the_error_file(
    api: str, tokenizer: Any, tiny_reference: Reference
) -> None:
    c = client(api)
    prompts = _prompts(6, seed=1)
    lines: list[dict[str, Any] | str] = ["", ""]  # blank lines: numbered, never fed
    lines += [completion_line(f"req-{i}", p, 6) for i, p in enumerate(prompts)]
    lines.insert(5, "")
    lines.append(completion_line("fan", prompts[0], 4, n=2))  # two jobs, one answer
    lines.append("{not json")
    lines.append(completion_line("other-model", prompts[1], 4, model="nope"))
    lines.append({**completion_line("wrong-url", prompts[1], 4), "url": "/v1/chat/completions"})
    lines.append(completion_line("bad-body", prompts[1], 4, temperature=-1))
    lines.append("")  # blank: not a request
    batch = c.batches.create(
        input_file_id=upload(c, lines),
        endpoint="/v1/completions",
        completion_window="24h",
        metadata={"suite": "exact"},
    )
    assert batch.status == "validating" and batch.metadata == {"suite": "exact"}
    done = wait_ended(c, batch.id)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (
        11,
        7,
        4,
    )
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    out = {line["custom_id"]: line for line in read_lines(c, done.output_file_id)}
    assert sorted(out) == sorted([f"req-{i}" for i in range(6)] + ["fan"])
    for i, prompt in enumerate(prompts):
        line = out[f"req-{i}"]
        assert line["error"] is None and line["response"]["status_code"] == 200
        body = line["response"]["body"]
        want = _text(tokenizer, tiny_reference(prompt, 6))
        assert body["object"] == "text_completion" and body["model"] == MODEL
        assert body["choices"][0]["text"] == want
        assert body["usage"]["prompt_tokens"] == len(prompt) and body["usage"]["completion_tokens"] == 6
    fan = out["fan"]["response"]["body"]
    want = _text(tokenizer, tiny_reference(prompts[0], 4))
    assert [ch["index"] for ch in fan["choices"]] == [0, 1] and all(
        ch["text"] == want for ch in fan["choices"]
    )
    errors = read_lines(c, done.error_file_id)
    assert len(errors) == 4 and len({e["id"] for e in errors}) == 4
    by_id = {e["custom_id"]: e for e in errors}
    assert set(by_id) == {None, "other-model", "wrong-url", "bad-body"}
    assert by_id["other-model"]["response"]["status_code"] == 404
    for e in errors:
        assert e["error"] is None and e["response"]["body"]["error"]["message"]
    assert by_id["bad-body"]["response"]["status_code"] == 400
    listed = c.batches.list(limit=100)
    assert batch.id in [b.id for b in listed.data]
    assert c.files.retrieve(done.output_file_id).purpose == "batch_output"
    scraped = httpx.get(f"{api}/metrics", timeout=10).text
    assert 'kvferry_batch_lines_total{outcome="completed",tenant="alice"}' in scraped
    assert 'kvferry_batch_lines_total{outcome="failed",tenant="alice"}' in scraped
    assert 'kvferry_batches{status="in_progress"}' in scraped


def test_another_tenants_batch_is_not_found(api: str) -> None:
    alice, bob = client(api), client(api, "key-bob")
    batch = alice.batches.create(
        input_file_id=upload(alice, [completion_line("x", [5, 6, 7], 2)]),
        endpoint="/v1/completions",
        completion_window="24h",
    )
    with pytest.raises(openai.NotFoundError):
        bob.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        bob.batches.cancel(batch.id)
    assert batch.id not in [b.id for b in bob.batches.list().data]
    with pytest.raises(openai.NotFoundError):  # nor can bob run a batch over alice's file
        bob.batches.create(
            input_file_id=batch.input_file_id, endpoint="/v1/completions", completion_window="24h"
        )
    with pytest.raises(openai.BadRequestError):
        alice.batches.create(
            input_file_id=batch.input_file_id, endpoint="/v1/embeddings", completion_window="24h"
        )  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError):
        alice.batches.create(
            input_file_id=batch.input_file_id, endpoint="/v1/completions", completion_window="1h"
        )  # type: ignore[arg-type]
    assert wait_ended(alice, batch.id).status == "completed"


def test_duplicate_custom_ids_fail_the_batch(api: str) -> None:
    c = client(api)
    line = completion_line("same", [5, 6, 7], 2)
    batch = c.batches.create(
        input_file_id=upload(c, [line, line]), endpoint="/v1/completions", completion_window="24h"
    )
    done = wait_ended(c, batch.id)
    assert done.status == "failed" and done.failed_at
    assert done.errors is not None and done.errors.data and done.errors.data[0].code == "duplicate_custom_id"
    assert done.errors.data[0].line == 2


def test_cancel_stops_feeding_and_writes_what_finished(api: str) -> None:
    c = client(api)
    lines: list[dict[str, Any] | str] = [
        completion_line(f"c-{i}", p, 48) for i, p in enumerate(_prompts(300, seed=2))
    ]
    batch = c.batches.create(
        input_file_id=upload(c, lines), endpoint="/v1/completions", completion_window="24h"
    )
    cancelling = c.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    done = wait_ended(c, batch.id)
    assert done.status == "cancelled" and done.cancelled_at
    out = read_lines(c, done.output_file_id)
    ids = [line["custom_id"] for line in out]
    assert len(ids) == len(set(ids)) and len(ids) < 300
    assert done.request_counts is not None and done.request_counts.completed == len(ids)
    with pytest.raises(openai.ConflictError):  # an ended batch is not cancelled again... (409)
        c.batches.cancel(wait_ended(c, _small(c)).id)


def _small(c: Any) -> str:
    return str(
        c.batches.create(
            input_file_id=upload(c, [completion_line("s", [9, 9], 2)]),
            endpoint="/v1/completions",
            completion_window="24h",
        ).id
    )


def test_expiry_ends_the_batch_expired_with_its_finished_part(
    own_redis: RedisServer, api: str, where: Path
) -> None:
    """A second api whose batches expire after 3 s (the runner reads the deadline from the
    record, whichever api runs it): the short line finished and is in the output file, the long
    ones expire into the error file, every custom_id once across the two."""
    # a second replica: the same Redis and the same file store
    expiring = batch_api(own_redis.url, where / "files", where / "api2.log", batch_expiry_s="3")
    url = next(expiring)
    try:
        c = client(url)
        lines: list[dict[str, Any] | str] = [completion_line("short", [3, 4, 5], 2)]
        lines += [completion_line(f"long-{i}", [6, 7, i + 8], 900) for i in range(80)]
        batch = c.batches.create(
            input_file_id=upload(c, lines), endpoint="/v1/completions", completion_window="24h"
        )
        assert batch.expires_at is not None and batch.expires_at - batch.created_at == 3
        done = wait_ended(c, batch.id, timeout_s=30)
        assert done.status == "expired" and done.expired_at, done
        out = {line["custom_id"]: line for line in read_lines(c, done.output_file_id)}
        errors = {line["custom_id"]: line for line in read_lines(c, done.error_file_id)}
        assert "short" in out and not set(out) & set(errors)
        assert set(out) | set(errors) == {"short"} | {f"long-{i}" for i in range(80)}
        expired = [e for e in errors.values() if e["error"] and e["error"]["code"] == "batch_expired"]
        assert len(expired) == len(errors) > 0 and all(e["response"] is None for e in expired)
        assert done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (len(out), len(errors))
    finally:
        expiring.close()
