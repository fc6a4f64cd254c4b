"""The batch runner's figures on the api's /metrics: lines written by tenant and outcome, and
the batches not yet ended by status (set by the runner on each pass)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from api.batches.records import Status

STATUSES: tuple[Status, ...] = ("validating", "in_progress", "finalizing", "cancelling")


class BatchMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.lines = Counter(
            "kvferry_batch_lines",
            "Batch lines written to their batch's output (completed) or error file (failed)",
            ["tenant", "outcome"],
            registry=registry,
        )
        self.batches = Gauge(
            "kvferry_batches", "Batches not yet ended, by status", ["status"], registry=registry
        )

    def count(self, by_status: dict[str, int]) -> None:
        for status in STATUSES:
            self.batches.labels(status).set(by_status.get(status, 0))
