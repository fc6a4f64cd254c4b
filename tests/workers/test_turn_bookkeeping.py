"""A turn's session bookkeeping never holds up nor fails its answer. An in-process worker (the
real EngineService, LeaseKeeper and JobRunner on the tiny model, a real redis-server):

- with the KV writer stuck on another session's slow write, the turn's JobDone is published
  at once; its session record names only blocks already in Redis, and once the writer gets
  through, the whole chain, with its pins;
- whatever the bookkeeping raises (not only RedisError), the job still ends done: a JobDone,
  no JobFailed, counted as a bookkeeping failure."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from broker import keys
from broker.codec import decode_event
from broker.jobs import events as job_events
from broker.jobs.events import EVENT_FIELD
from broker.messages import ChatMessage, GenerateJob, GenerateResult, JobDone, JobFailed
from broker.sampling import SamplingParams
from broker.sessions import store as session_store
from kvstore.redis.keys import PinOwner
from kvstore.tiers.stored_block import StoredBlock
from ops.redis.server import RedisServer
from workers.engine.config import EngineConfig
from workers.jobs.engine_service import EngineService, WorkerIdentity
from workers.jobs.lease_keeper import LeaseKeeper
from workers.jobs.runner import JobRunner
from workers.tiers.config import TierConfig

MODEL, TENANT = "tiny", "t"
SLOW = b"\x01" * 32  # another session's block, whose write hangs


@dataclass
class Worker:
    service: EngineService
    runner: JobRunner
    client: redis.Redis


@pytest.fixture(scope="module")
def worker(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, kvferry_cache_dir: Path
) -> Iterator[Worker]:
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        config = EngineConfig(
            model=str(tiny_model_dir),
            served_model_name=MODEL,
            cache_size_bytes=4 * 1024**2,
            warm_cache_size_bytes=4 * 1024**2,
            torch_threads=1,
            dtype="float32",
        )
        tiers = TierConfig(redis_capacity_bytes=64 * 1024**2)
        service = EngineService(config, kvferry_cache_dir, server.url, WorkerIdentity("book@test"), tiers)
        leases = LeaseKeeper(service.redis, "book@test", ttl_s=10, renew_s=1)
        service.loop()
        yield Worker(service, JobRunner(service, leases, time_limit_s=60), redis.Redis.from_url(server.url))
        service.shutdown()
        leases.stop()


def _turn(session: str, words: int = 40) -> GenerateJob:
    user = " ".join(f"word{i}" for i in range(words))
    return GenerateJob(
        MODEL,
        endpoint="chat",
        messages=(ChatMessage("user", user),),
        params=SamplingParams(max_tokens=8, ignore_eos=True),
        session_id=session,
        tenant=TENANT,
        submitted_at=time.time(),
    )


def _run(worker: Worker, job: GenerateJob) -> tuple[str, threading.Thread, list[Any]]:
    job_id, out = str(uuid.uuid4()), list[Any]()
    thread = threading.Thread(target=lambda: out.append(worker.runner.run(job_id, job)), daemon=True)
    thread.start()
    return job_id, thread, out


def _done_within(client: redis.Redis, job_id: str, timeout_s: float) -> JobDone | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = job_events.progress(client, job_id).done
        if done is not None:
            return done
        time.sleep(0.02)
    return None


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_the_answer_does_not_wait_for_other_sessions_writes(
    worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier, writer = worker.service.redis_tier, worker.service.writer
    assert tier is not None and writer is not None
    gate, entered = threading.Event(), threading.Event()
    real_put = tier.put

    def put(
        blocks: Sequence[StoredBlock], before_tx: Callable[[], None] | None = None, alone: object = ()
    ) -> int:
        if any(b.block_hash == SLOW for b in blocks):
            entered.set()
            gate.wait(60)  # another session's write through a slow Redis
            return 0
        return real_put(blocks, before_tx)

    monkeypatch.setattr(tier, "put", put)
    writer.enqueue([StoredBlock(SLOW, SLOW, tuple(range(16)), bytes(tier.fmt.nbytes))], pinned=True)
    assert entered.wait(5)
    session = f"s-{uuid.uuid4().hex[:8]}"
    try:
        job_id, thread, _ = _run(worker, _turn(session))
        done = _done_within(worker.client, job_id, 10)
        assert done is not None, "JobDone waited for another session's write"
        record = session_store.load(worker.client, TENANT, session)
        assert record is not None and len(record.token_ids) == done.result.usage.total_tokens
        named = [bytes.fromhex(h) for h in record.block_hashes]
        assert tier.contains_run(named) == len(named)  # every block it names is in Redis
        assert session_store.load_tokens(worker.client, TENANT, session) is not None  # the next turn's
    finally:
        gate.set()
    thread.join(30)
    _wait(lambda: _settled(worker, session), 10, "the record and pins to follow the written chain")


def _settled(worker: Worker, session: str) -> bool:
    tier = worker.service.redis_tier
    record = session_store.load(worker.client, TENANT, session)
    assert tier is not None and record is not None
    named = [bytes.fromhex(h) for h in record.block_hashes]
    pins = worker.client.smembers(tier.keys.pinset(PinOwner.session(TENANT, session)))  # type: ignore[arg-type]
    full = len(named) == len(record.token_ids) // worker.service.config.block_size
    return full and tier.contains_run(named) == len(named) and set(pins) == set(named)


@pytest.mark.parametrize("step", ["remember", "after_write"])
def test_a_bookkeeping_failure_never_fails_the_answered_job(
    worker: Worker, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    def boom(*_: Any) -> None:
        raise RuntimeError("bookkeeping broke")

    monkeypatch.setattr(worker.service.sessions, step, boom)
    failures = worker.service.sessions.bookkeeping_failures
    failed = worker.service.counts.failed
    job_id = str(uuid.uuid4())
    result = worker.runner.run(job_id, _turn(f"f-{uuid.uuid4().hex[:8]}"))
    assert isinstance(result, GenerateResult) and len(result.token_ids) == 8
    entries: Any = worker.client.xrange(keys.job_stream(job_id))
    finals = [e for _, f in entries if isinstance(e := decode_event(f[EVENT_FIELD]), (JobDone, JobFailed))]
    assert [type(e) for e in finals] == [JobDone]
    assert worker.service.sessions.bookkeeping_failures == failures + 1
    assert worker.service.counts.failed == failed
