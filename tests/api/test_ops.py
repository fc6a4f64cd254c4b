"""/healthz and /metrics, with heartbeats written the way workers write them."""

from __future__ import annotations

import importlib.metadata
import time
from collections.abc import Callable

import redis
from fastapi.testclient import TestClient

from api.app import create_app
from api.config import ApiConfig
from broker import keys
from broker.messages import EngineFigures, WorkerStatus
from broker.worker_registry import HEARTBEAT_FIELD, encode_status
from tests.api.conftest import MODEL, Served, free_port
from tests.api.fake_worker import FakeWorker

FIGURES = EngineFigures(
    num_running=2,
    num_waiting=1,
    num_steps=10,
    max_batch_seqs=32,
    generation_tokens=50,
    pool_blocks_total=100,
    pool_blocks_used=25,
    pool_blocks_cached=10,
    bytes_per_block=4096,
    prefix_cache_queries_tokens=64,
    prefix_cache_hits_tokens=48,
    fragmentation=0.125,
    weights_bytes=1,
    pool_bytes=2,
    num_preemptions=3,
)


def heartbeat(rds: redis.Redis, name: str, engine: EngineFigures | None) -> None:
    status = WorkerStatus(name, keys.worker_queue(name), MODEL, 1, 5, 0, time.time(), engine)
    rds.hset(keys.worker_heartbeat(name), HEARTBEAT_FIELD, encode_status(status))
    rds.expire(keys.worker_heartbeat(name), 30)
    rds.sadd(keys.WORKERS, name)


def test_healthz_counts_live_workers(api: Served, rds: redis.Redis) -> None:
    heartbeat(rds, "w1", FIGURES)
    heartbeat(rds, "w2", None)
    rds.sadd(keys.WORKERS, "dead")  # announced once, heartbeat expired
    with api.client() as c:
        r = c.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "redis": True, "workers": 2}


def test_healthz_without_redis_is_503() -> None:
    app = create_app(ApiConfig(redis_url=f"redis://127.0.0.1:{free_port()}/0"))
    with TestClient(app) as c:
        r = c.get("/healthz")
    assert r.status_code == 503
    assert r.json() == {"status": "unavailable", "redis": False, "workers": 0}


def test_health_is_ready_only_with_redis_and_a_live_worker(api: Served, rds: redis.Redis) -> None:
    with api.client() as c:
        none_yet = c.get("/health")
        heartbeat(rds, "w1", FIGURES)
        ready = c.get("/health")
    assert none_yet.status_code == 503
    assert none_yet.json()["error"]["type"] == "service_unavailable_error"
    assert "worker" in none_yet.json()["error"]["message"]
    assert ready.status_code == 200 and ready.json() == {}


def test_health_without_redis_is_503() -> None:
    app = create_app(ApiConfig(redis_url=f"redis://127.0.0.1:{free_port()}/0"))
    with TestClient(app) as c:
        r = c.get("/health")
    assert r.status_code == 503 and "Redis" in r.json()["error"]["message"]


def test_version_is_the_package_version(serve: Callable[..., Served]) -> None:
    api = serve(api_key="k-version")  # open, like /health: no key needed
    with api.client() as c:
        r = c.get("/version")
    body = r.json()
    assert r.status_code == 200 and body["version"] == importlib.metadata.version("kvferry")
    # and, once a worker has built its engine, the precisions the workers compute in (issue 41)
    assert set(body) <= {"version", "dtype", "kv_cache_dtype"}
    assert all(d in ("float32", "bfloat16", "float16") for d in body.get("dtype", []))


def test_metrics_families(fresh_api: Served, rds: redis.Redis, worker: FakeWorker) -> None:
    heartbeat(rds, "w1", FIGURES)
    heartbeat(rds, "loading", None)
    rds.sadd(keys.WORKERS, "dead")
    rds.rpush(keys.worker_queue("w1"), b"m1", b"m2")
    with fresh_api.client() as c:
        c.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
        c.post("/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "x"}]})
        c.get("/v1/jobs/abc")
        r = c.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    expected = [
        'kvferry_api_requests_total{endpoint="/v1/chat/completions",status="200"} 1.0',
        'kvferry_api_requests_total{endpoint="/v1/chat/completions",status="404"} 1.0',
        'kvferry_api_requests_total{endpoint="/v1/jobs/{job_id}",status="404"} 1.0',
        'kvferry_api_ttft_seconds_count{endpoint="chat"} 1.0',
        'kvferry_api_job_latency_seconds_count{endpoint="chat"} 1.0',
        f'kvferry_queue_depth{{queue="{keys.SHARED_QUEUE}"}} 0.0',
        f'kvferry_queue_depth{{queue="{keys.worker_queue("w1")}"}} 2.0',
        'kvferry_worker_live{worker="w1"} 1.0',
        'kvferry_worker_live{worker="loading"} 1.0',
        'kvferry_worker_live{worker="dead"} 0.0',
        'kvferry_worker_jobs_running{worker="w1"} 1.0',
        'kvferry_worker_kv_usage_ratio{worker="w1"} 0.25',
        'kvferry_worker_blocks_used{worker="w1"} 25.0',
        'kvferry_worker_blocks_cached{worker="w1"} 10.0',
        'kvferry_worker_blocks_total{worker="w1"} 100.0',
        'kvferry_worker_prefix_cache_queries_tokens_total{worker="w1"} 64.0',
        'kvferry_worker_prefix_cache_hits_tokens_total{worker="w1"} 48.0',
        'kvferry_worker_generation_tokens_total{worker="w1"} 50.0',
        'kvferry_worker_num_preemptions_total{worker="w1"} 3.0',
        'kvferry_worker_jobs_done_total{worker="w1"} 5.0',
        'kvferry_tenant_requests_total{tenant=""} 3.0',
        'kvferry_tenant_prompt_tokens_total{tenant=""} 7.0',
        'kvferry_tenant_completion_tokens_total{tenant=""} 3.0',
        'kvferry_tenant_cached_tokens_total{tenant=""} 4.0',
        'kvferry_tenant_jobs{tenant=""} 0.0',
        "# TYPE kvferry_api_requests_total counter",
        "# TYPE kvferry_worker_prefix_cache_hits_tokens_total counter",
        "# TYPE kvferry_worker_blocks_used gauge",
        'kvferry_worker_num_running_seqs{worker="w1"} 2.0',
        'kvferry_worker_num_waiting_seqs{worker="w1"} 1.0',
        'kvferry_worker_fragmentation_ratio{worker="w1"} 0.125',
    ]
    missing = [line for line in expected if line not in text]
    assert not missing, missing
    assert 'kvferry_worker_blocks_used{worker="loading"}' not in text


def test_metrics_forget_vanished_workers(api: Served, rds: redis.Redis) -> None:
    heartbeat(rds, "w9", FIGURES)
    with api.client() as c:
        assert 'worker="w9"' in c.get("/metrics").text
        rds.delete(keys.WORKERS, keys.worker_heartbeat("w9"))
        assert 'worker="w9"' not in c.get("/metrics").text


def test_metrics_show_the_redis_tier(fresh_api: Served, rds: redis.Redis) -> None:
    from kvstore.redis.keys import TIER_REGISTRY, TierKeys
    from workers.tiers.report_publisher import publish_report

    rds.sadd(TIER_REGISTRY, "fp1")
    rds.hset(
        TierKeys("fp1").counters,
        mapping={"hits": 5, "misses": 2, "bytes_read": 640, "bytes_read_tail": 40, "bytes_written": 1280},
    )
    with fresh_api.client() as c:
        assert "kvferry_redis_tier_hits_total" not in c.get("/metrics").text  # nothing published yet
        assert publish_report(rds, rds, "w1") and not publish_report(rds, rds, "w2")  # one a period
        text = c.get("/metrics").text
    for line in (
        "kvferry_redis_tier_hits_total 5.0",
        "kvferry_redis_tier_misses_total 2.0",
        "kvferry_redis_tier_bytes_read_total 640.0",
        'kvferry_redis_tier_bytes_read_by_cause_total{cause="tail"} 40.0',
        'kvferry_redis_tier_bytes_read_by_cause_total{cause="job"} 0.0',
        "kvferry_redis_tier_bytes_written_total 1280.0",
        "kvferry_redis_tier_orphan_pins 0.0",
        "# TYPE kvferry_redis_tier_hits_total counter",
    ):
        assert line in text, line
