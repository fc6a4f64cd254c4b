"""Prometheus metrics, one registry per app, named by Prometheus conventions: what only grows is
a counter (`_total`), what goes up and down a gauge.

- counted here: requests (by route and status, and by tenant), tokens by tenant, 429s by tenant,
  job latency and TTFT;
- read from Redis at scrape time: queue depths, unfinished jobs per tenant, and each worker's
  figures from its heartbeat (its cumulative counts exposed as counters)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.background import BackgroundCollector
from api.jobs import tenant_jobs
from api.metrics import dispatch as dispatch_metrics
from api.routing import fleet
from api.routing.fleet import WorkerView
from api.scale.policy import ScalePolicy
from api.scale.signal import ScaleCollector
from broker.messages import EngineFigures, Usage

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80)

# per-worker gauges from the heartbeat's EngineFigures: name -> (help, value)
_ENGINE_GAUGES = {
    "kv_usage_ratio": ("Share of the KV pool's blocks in use", lambda e: e.kv_usage),
    "blocks_used": ("KV blocks held by running sequences", lambda e: e.pool_blocks_used),
    "blocks_cached": ("Free KV blocks that still hold a cached prefix", lambda e: e.pool_blocks_cached),
    "blocks_total": ("KV blocks in the pool", lambda e: e.pool_blocks_total),
    "num_running_seqs": ("Sequences in the running batch", lambda e: e.num_running),
    "num_waiting_seqs": ("Sequences waiting to be scheduled", lambda e: e.num_waiting),
    "fragmentation_ratio": ("Allocated but unfilled share of the used KV slots", lambda e: e.fragmentation),
}
# ... and the cumulative ones, exposed as counters (`_total` is added by the exposition)
_ENGINE_COUNTERS = {
    "prefix_cache_queries_tokens": (
        "Prompt tokens looked up in the prefix cache",
        lambda e: e.prefix_cache_queries_tokens,
    ),
    "prefix_cache_hits_tokens": (
        "Prompt tokens found in the prefix cache",
        lambda e: e.prefix_cache_hits_tokens,
    ),
    "generation_tokens": ("Tokens generated", lambda e: e.generation_tokens),
    "engine_steps": ("Engine steps run", lambda e: e.num_steps),
    "num_preemptions": ("Running sequences preempted for want of KV blocks", lambda e: e.num_preemptions),
}


@dataclass
class Snapshot:
    """What a scrape read from Redis, for the collector to expose."""

    views: list[WorkerView] = field(default_factory=list)
    depths: dict[str, int] = field(default_factory=dict)
    tenant_jobs: dict[str, int] = field(default_factory=dict)
    tier: dict[str, Any] | None = None  # as a worker last published it (keys.TIER_REPORT)


class _FromRedis(Collector):
    def __init__(self) -> None:
        self.snapshot = Snapshot()

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot
        depth = GaugeMetricFamily("kvferry_queue_depth", "Messages waiting in a queue", labels=["queue"])
        for queue, n in s.depths.items():
            depth.add_metric([queue], n)
        jobs = GaugeMetricFamily(
            "kvferry_tenant_jobs", "A tenant's unfinished jobs (the per-tenant job cap)", labels=["tenant"]
        )
        for tenant, n in s.tenant_jobs.items():
            jobs.add_metric([tenant], n)
        live = GaugeMetricFamily(
            "kvferry_worker_live", "1 while the worker's heartbeat is fresh", labels=["worker"]
        )
        running = GaugeMetricFamily(
            "kvferry_worker_jobs_running", "Jobs the worker runs now", labels=["worker"]
        )
        done = CounterMetricFamily("kvferry_worker_jobs_done", "Jobs the worker finished", labels=["worker"])
        failed = CounterMetricFamily(
            "kvferry_worker_jobs_failed", "Jobs that failed on the worker", labels=["worker"]
        )
        gauges = {
            n: GaugeMetricFamily(f"kvferry_worker_{n}", h, labels=["worker"])
            for n, (h, _) in _ENGINE_GAUGES.items()
        }
        counters = {
            n: CounterMetricFamily(f"kvferry_worker_{n}", h, labels=["worker"])
            for n, (h, _) in _ENGINE_COUNTERS.items()
        }
        precision = GaugeMetricFamily(
            "kvferry_worker_precision",
            "1, labelled with the dtype the worker computes in and its hot KV cache's",
            labels=["worker", "dtype", "kv_cache_dtype"],
        )
        for view in s.views:
            live.add_metric([view.name], 1 if view.live else 0)
            if view.status is None:
                continue
            running.add_metric([view.name], view.status.jobs_running)
            done.add_metric([view.name], view.status.jobs_done)
            failed.add_metric([view.name], view.status.jobs_failed)
            e: EngineFigures | None = view.status.engine
            if e is None:  # still loading its model
                continue
            precision.add_metric([view.name, e.dtype, e.kv_cache_dtype], 1)
            for name, (_, value) in _ENGINE_GAUGES.items():
                gauges[name].add_metric([view.name], value(e))
            for name, (_, value) in _ENGINE_COUNTERS.items():
                counters[name].add_metric([view.name], value(e))
        yield from (depth, jobs, live, running, done, failed, precision, *gauges.values(), *counters.values())
        if s.tier is not None:
            yield from _tier(s.tier)


# the Redis tier's report: name -> (help, is a counter)
_TIER = {
    "hits": ("Blocks found in the Redis tier", True),
    "misses": ("Blocks looked up in the Redis tier and not found", True),
    "bytes_read": ("Bytes read from the Redis tier", True),
    "blocks_fetched": (
        "Blocks in the packs read from the Redis tier, used or not (packs are read whole)",
        True,
    ),
    "bytes_written": ("Bytes written to the Redis tier", True),
    "packs_evicted": ("Block packs the tier's LRU evicted", True),
    "writes_dropped": ("Block writes to the Redis tier dropped by a full writer queue", True),
    "bytes_stored": ("Bytes the Redis tier holds", False),
    "orphan_pins": ("Session pins whose session is gone (must be 0)", False),
}


def _tier(report: dict[str, Any]) -> Iterator[Metric]:
    for name, (text, counter) in _TIER.items():
        if name in report:
            kind = CounterMetricFamily if counter else GaugeMetricFamily
            yield kind(f"kvferry_redis_tier_{name}", text, value=report[name])
    by_cause = CounterMetricFamily(
        "kvferry_redis_tier_bytes_read_by_cause", "Bytes read from the Redis tier, by why", labels=["cause"]
    )
    for name in sorted(n for n in report if n.startswith("bytes_read_")):  # kvstore/redis/keys.py READ_CAUSES
        by_cause.add_metric([name.removeprefix("bytes_read_")], report[name])
    yield by_cause
    pinned = GaugeMetricFamily(
        "kvferry_redis_tier_pinned_bytes", "Bytes of session-pinned blocks by tenant", labels=["tenant"]
    )
    for tenant, n in (report.get("pinned_bytes_by_tenant") or {}).items():
        pinned.add_metric([tenant], n)
    yield pinned


class ApiMetrics:
    def __init__(self, scale: ScalePolicy | None = None) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "kvferry_api_requests",
            "HTTP requests by route and status code",
            ["endpoint", "status"],
            registry=r,
        )
        self.tenant_requests = Counter(
            "kvferry_tenant_requests", "Authenticated HTTP requests by tenant", ["tenant"], registry=r
        )
        self.tenant_rejected = Counter(
            "kvferry_tenant_jobs_rejected",
            "Jobs refused with 429: the tenant was at its job cap",
            ["tenant"],
            registry=r,
        )
        self.tenant_prompt_tokens = Counter(
            "kvferry_tenant_prompt_tokens",
            "Prompt tokens of a tenant's finished jobs",
            ["tenant"],
            registry=r,
        )
        self.tenant_cached_tokens = Counter(
            "kvferry_tenant_cached_tokens", "Prompt tokens served from a cache", ["tenant"], registry=r
        )
        self.tenant_completion_tokens = Counter(
            "kvferry_tenant_completion_tokens", "Tokens generated for a tenant", ["tenant"], registry=r
        )
        self.cached_tokens = Counter(
            "kvferry_cached_tokens",
            "Prompt tokens not computed, by where they were found (pool, warm tier, Redis tier)",
            ["source"],
            registry=r,
        )
        self.job_latency = Histogram(
            "kvferry_api_job_latency_seconds",
            "From submission to the job's final event, as the api sees it",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "kvferry_api_ttft_seconds",
            "From submission to the job's first token, as the api sees it",
            ["endpoint"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.accepts_unreplicated = Counter(
            "kvferry_api_accepts_unreplicated",
            "Jobs accepted under Sentinel with no replica holding them yet (api/jobs/submit_write.py)",
            registry=r,
        )
        self.queue_wait = dispatch_metrics.queue_wait_histogram(r)
        self._redis = _FromRedis()
        r.register(self._redis)
        self._dispatch = dispatch_metrics.DispatchCollector()
        r.register(self._dispatch)
        self.scale = ScaleCollector(scale or ScalePolicy())  # the scaling signal (api/scale/)
        r.register(self.scale)
        self.background = BackgroundCollector()  # the dispatcher's and batch runner's failures
        r.register(self.background)

    def observe_queue_wait(self, tenant: str, job_class: str, seconds: float) -> None:
        """A finished job's queue wait (its result's queue_wait_s), once per job; job_class is
        "interactive" or "batch" (the batch runner observes its lines)."""
        self.queue_wait.labels(tenant, job_class).observe(max(0.0, seconds))
        self.scale.waits.observe(time.monotonic(), seconds)

    def tokens(self, tenant: str, usage: Usage) -> None:
        """A finished job's usage (counted once per job: see tenant_jobs.finish)."""
        self.tenant_prompt_tokens.labels(tenant).inc(usage.prompt_tokens)
        self.tenant_cached_tokens.labels(tenant).inc(usage.cached_tokens)
        self.tenant_completion_tokens.labels(tenant).inc(usage.completion_tokens)
        for source, n in (
            ("pool", usage.pool_tokens),
            ("warm", usage.warm_tokens),
            ("redis", usage.redis_tokens),
        ):
            self.cached_tokens.labels(source).inc(n)

    async def render(
        self,
        client: aioredis.Redis,
        tenants: list[str],
        tier: dict[str, Any] | None = None,
        headroom: int = 0,
    ) -> bytes:
        """Read what lives in Redis, then the exposition text (headroom: the dispatch window's)."""
        views = await fleet.workers(client)
        self._dispatch.snapshot = await dispatch_metrics.read(client, views, headroom)
        depths = await fleet.queue_depths(client, [v.name for v in views])
        jobs = await tenant_jobs.running(client, tenants)
        await self.scale.read(client, views)
        self._redis.snapshot = Snapshot(
            views, depths, jobs, tier
        )  # one assignment: a scrape sees one snapshot
        return generate_latest(self.registry)


class RequestCounter:
    """ASGI middleware: counts each HTTP request by its route template and status code, and by
    its tenant once auth named one (api/auth.py leaves it in the request's state)."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def counting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            route = scope.get("route")
            # the route's template, so /v1/jobs/{job_id} is one series however many ids there are
            endpoint = route.path if isinstance(route, BaseRoute) and hasattr(route, "path") else "other"
            self.metrics.requests.labels(endpoint, str(status)).inc()
            tenant = (scope.get("state") or {}).get("tenant")
            if isinstance(tenant, str):
                self.metrics.tenant_requests.labels(tenant).inc()
