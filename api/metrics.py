"""Prometheus metrics, one registry per app: requests, job latency and TTFT, queue depths, and
each worker's pool figures (read from its heartbeat at scrape time)."""

from __future__ import annotations

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api import fleet

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80)

# per-worker gauges read from the heartbeat's EngineFigures: name -> help
_ENGINE_GAUGES = {
    "kv_usage_ratio": "Share of the KV pool's blocks in use",
    "blocks_used": "KV blocks held by running sequences",
    "blocks_cached": "Free KV blocks that still hold a cached prefix",
    "blocks_total": "KV blocks in the pool",
    "prefix_cache_queries_tokens": "Prompt tokens looked up in the prefix cache (cumulative)",
    "prefix_cache_hits_tokens": "Prompt tokens found in the prefix cache (cumulative)",
    "num_running_seqs": "Sequences in the running batch",
    "num_waiting_seqs": "Sequences waiting to be scheduled",
    "fragmentation_ratio": "Allocated but unfilled share of the used KV slots",
}


class ApiMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "kvferry_api_requests",
            "HTTP requests by route and status code",
            ["endpoint", "status"],
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
        self.queue_depth = Gauge("kvferry_queue_depth", "Messages waiting in a queue", ["queue"], registry=r)
        self.worker_live = Gauge(
            "kvferry_worker_live", "1 while the worker's heartbeat is fresh", ["worker"], registry=r
        )
        self.worker_jobs = Gauge(
            "kvferry_worker_jobs_running", "Jobs the worker runs now", ["worker"], registry=r
        )
        self.engine = {
            name: Gauge(f"kvferry_worker_{name}", text, ["worker"], registry=r)
            for name, text in _ENGINE_GAUGES.items()
        }

    async def render(self, client: aioredis.Redis) -> bytes:
        """Refresh the gauges read from Redis, then the exposition text."""
        views = await fleet.workers(client)
        depths = await fleet.queue_depths(client, [v.name for v in views])
        for gauge in (self.queue_depth, self.worker_live, self.worker_jobs, *self.engine.values()):
            gauge.clear()  # a worker or queue that vanished stops being reported
        for queue, depth in depths.items():
            self.queue_depth.labels(queue).set(depth)
        for view in views:
            self.worker_live.labels(view.name).set(1 if view.live else 0)
            if view.status is None:
                continue
            self.worker_jobs.labels(view.name).set(view.status.jobs_running)
            e = view.status.engine
            if e is None:  # still loading its model
                continue
            values = {
                "kv_usage_ratio": e.kv_usage,
                "blocks_used": e.pool_blocks_used,
                "blocks_cached": e.pool_blocks_cached,
                "blocks_total": e.pool_blocks_total,
                "prefix_cache_queries_tokens": e.prefix_cache_queries_tokens,
                "prefix_cache_hits_tokens": e.prefix_cache_hits_tokens,
                "num_running_seqs": e.num_running,
                "num_waiting_seqs": e.num_waiting,
                "fragmentation_ratio": e.fragmentation,
            }
            for name, value in values.items():
                self.engine[name].labels(view.name).set(value)
        return generate_latest(self.registry)


class RequestCounter:
    """ASGI middleware: counts each HTTP request by its route template and status code."""

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
