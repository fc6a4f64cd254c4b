"""`kvferry chaos` in a precision other than fp32 (ops/chaos/own_answers.py): each stream is
checked against its own job's final answer, read from a real Redis; the fault-free pass's and
HF fp32's differences are figures, not failures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from broker import keys
from broker.codec import encode_event
from broker.jobs.events import EVENT_FIELD
from broker.messages import GenerateResult, JobDone, Usage
from ops.chaos.check import report
from ops.chaos.clients import JobRecord
from ops.chaos.fault_log import FaultLog
from ops.chaos.own_answers import agreement, exact_precision, is_exact_run, own_answers
from ops.redis.server import RedisServer
from ops.settings import Settings

CLEAN = {
    "integrity_ok": {"w1@h": True},
    "engine_step_failures": 0,
    "raw_duplicated_tokens": 0,
    "raw_duplicated_finals": 0,
    "hf_checked": 2,
    "hf_uncovered": [],
    "hf_unverified": [],
    "hf_examples": [],
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("redis")) as s:
        yield s


def _streamed(key: str, chunks: list[str]) -> JobRecord:
    record = JobRecord(key, job_id=f"id-{key}", status="completed", stream_complete=True)
    record.chunks = [(0.0, 0, c) for c in chunks]
    record.text = record.streamed  # a stream that completed: its answer is what it streamed
    record.usage = {"completion_tokens": 4}
    record.submit_attempts = 1
    return record


def _final(client: redis.Redis, record: JobRecord, text: str) -> None:
    result = GenerateResult(
        str(record.job_id), "m", text, (1, 2, 3, 4), "length", Usage(3, 4, 0), "w1@h", 0, 0, 0
    )
    client.xadd(keys.job_stream(str(record.job_id)), {EVENT_FIELD: encode_event(JobDone(result))})


def test_only_an_all_fp32_stack_is_an_exact_run() -> None:
    fp32 = {"dtype": "float32", "kv_cache_dtype": "float32"}
    assert exact_precision(Settings(dtype="auto", kv_cache_dtype="auto", quantization="none")) == fp32
    assert exact_precision(Settings(dtype="bfloat16")) == {}  # asked for: run as asked
    assert exact_precision(Settings(dtype="auto", quantization="int8")) == {}
    assert is_exact_run(Settings(dtype="float32", kv_cache_dtype="auto"))
    assert not is_exact_run(Settings(dtype="bfloat16"))
    assert not is_exact_run(Settings(dtype="float32", kv_cache_dtype="int8"))
    assert not is_exact_run(Settings(dtype="bfloat16", quantization="int8"))


def test_streams_are_checked_against_their_own_answers_and_differences_are_figures(
    server: RedisServer, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(server.url)
    settings = Settings(redis_url=server.url, dtype="bfloat16")
    ok = _streamed("c0.r0.chat.t0", ["one ", "two"])  # differs from the reference: bf16's own answer
    same = _streamed("c1.r0.chat.t0", ["three"])
    repeated = _streamed("c2.r0.chat.t0", ["four ", "four ", "five"])  # a chunk streamed twice
    for record, text in ((ok, "one two"), (same, "three"), (repeated, "four five")):
        _final(client, record, text)
    records = [ok, same, repeated]
    fault_free = {
        r.key: _streamed(r.key, [t]) for r, t in zip(records, ["uno", "three", "four five"], strict=True)
    }

    own = own_answers(settings, records)
    assert {k: r.text for k, r in own.items()} == {
        ok.job_id: "one two",
        same.job_id: "three",
        repeated.job_id: "four five",
    }
    extra: dict[str, Any] = {**CLEAN, "hf_mismatches": 1, "exact_run": False}
    extra["agree_with_reference"] = agreement(records, fault_free)
    assert extra["agree_with_reference"] == 1
    result = report(records, own, FaultLog(), 1.0, extra, by_job=True)
    assert result["duplicated_tokens"] > 0 and result["exact"] == 2  # the repeat is caught
    assert result["failures"] == ["of 3 jobs, 3 completed, 2 exact", "streams repeated or dropped tokens"]

    clean = report(
        records[:2], own, FaultLog(), 1.0, extra, by_job=True
    )  # HF's and the reference's differences pass
    assert clean["passed"], clean["failures"]
    assert not report(records[:2], own, FaultLog(), 1.0, {**extra, "exact_run": True}, by_job=True)["passed"]
    del extra["agree_with_reference"]
    assert (
        "no agreement with the fault-free pass counted"
        in report(records[:2], own, FaultLog(), 1.0, extra, by_job=True)["failures"]
    )
