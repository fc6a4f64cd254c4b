"""The KV tier on a real 3-shard Redis Cluster (KVFERRY_KV_REDIS_URL=redis+cluster://...): a
session's turns alternate between two workers, so each turn reads the last one's blocks from the
cluster; then a shard is SIGKILLed, then the metadata's shard too. Every turn stays token-exact
against HF greedy, no job fails, and the worker logs show no traceback."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.codec import decode_result
from broker.messages import GenerateJob, GenerateResult
from broker.sampling import SamplingParams
from kvstore.redis.client import kv_client
from kvstore.redis.keys import PACK_PREFIX, TIER_REGISTRY, TierKeys
from ops.redis.cluster import LocalCluster
from tests.integration.conftest import MODEL, WorkerProcess, WorkerStarter
from tests.integration.jobs import send

Reference = Callable[[list[int], int], list[int]]
NEW_TOKENS = 6


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "kv-cluster", shards=3) as c:
        yield c


def _turn(app: Any, worker: WorkerProcess, prompt: list[int], session: str) -> tuple[GenerateResult, float]:
    job = GenerateJob(
        model=MODEL,
        prompt_token_ids=tuple(prompt),
        params=SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True),
        session_id=session,
        submitted_at=time.time(),
    )
    started = time.monotonic()
    result = decode_result(send(app, job, worker.queue).get(timeout=120))
    return result, time.monotonic() - started


def test_session_turns_stay_exact_through_kv_shard_kills(
    worker_factory: WorkerStarter,
    cluster: LocalCluster,
    celery_app: Any,
    tiny_reference: Reference,
) -> None:
    args = ("--kv-redis-url", cluster.url, "--redis-cache-size", "64M", "--kv-write-defer", "0")
    workers = worker_factory.several(("kvc1", *args), ("kvc2", *args))
    kv = kv_client(cluster.url)
    rng = random.Random(26)
    session = f"cluster-{uuid.uuid4().hex[:8]}"
    prompt = [rng.randrange(100, 49152) for _ in range(200)]
    timings: list[tuple[str, float, int]] = []

    def turn(i: int, phase: str) -> GenerateResult:
        nonlocal prompt
        result, took = _turn(celery_app, workers[i % 2], prompt, session)
        assert list(result.token_ids) == tiny_reference(prompt, NEW_TOKENS), (phase, i)
        timings.append((phase, took, result.usage.redis_tokens))
        prompt = [*prompt, *result.token_ids, *(rng.randrange(100, 49152) for _ in range(40))]
        time.sleep(0.5)  # the turn's write-through lands before the other worker reads it
        return result

    results = [turn(i, "healthy") for i in range(3)]
    assert sum(r.usage.redis_tokens for r in results[1:]) > 0  # read from the cluster
    packs = list(kv.scan_iter(match=PACK_PREFIX + "*"))
    holding = {cluster.shard_of_slot(kv.keyslot(p)) for p in packs}
    assert len(holding) > 1, packs  # the session's packs spread over the shards

    fingerprints = [m.decode() for m in kv.smembers(TIER_REGISTRY)]
    meta = {cluster.shard_of_slot(kv.keyslot(TierKeys(fp).index)) for fp in fingerprints}
    victim = next(i for i in sorted(holding) if i not in meta)  # holds some of the session's packs
    cluster.kill_shard(victim)
    results += [turn(i, "shard down") for i in range(3, 6)]
    for shard in meta:
        cluster.kill_shard(shard)
    results += [turn(i, "metadata down") for i in range(6, 8)]
    assert all(r.usage.redis_tokens == 0 for r in results[6:])  # every block a miss: recomputed

    for worker in workers:
        log = worker.log.read_text()
        assert "Traceback" not in log, log[-3000:]
    print("\nturn timings (phase, seconds, redis tokens):")
    for phase, took, redis_tokens in timings:
        print(f"  {phase:14s} {took:6.3f} s  {redis_tokens:4d}")
