"""The local autoscaler of `kvferry serve --autoscale MIN:MAX`: it follows the api's
kvferry_desired_workers gauge, the one scaling policy (api/scale/policy.py), as KEDA does on
Kubernetes (deploy/k8s/keda-scaledobject.yaml), starting and stopping the stack's worker
processes one at a time. A worker it removes gets SIGTERM and drains (workers/process/drain.py):
no new jobs, its running ones finish, its blocks are written through, it leaves and exits."""

from __future__ import annotations

import logging
import signal
import subprocess
from collections.abc import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ops.stack.stack import Stack

log = logging.getLogger(__name__)
GAUGE = "kvferry_desired_workers"


def parse_bounds(text: str) -> tuple[int, int]:
    """ "MIN:MAX" -> (MIN, MAX); ValueError unless 1 <= MIN <= MAX."""
    low, sep, high = text.partition(":")
    if not sep or not low.isdigit() or not high.isdigit() or not 1 <= int(low) <= int(high):
        raise ValueError(f"--autoscale takes MIN:MAX with 1 <= MIN <= MAX, got {text!r}")
    return int(low), int(high)


def desired_from_metrics(api_url: str, token: str | None = None) -> int | None:
    """The api's kvferry_desired_workers; None when the api cannot say (starting, away)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        text = httpx.get(f"{api_url}/metrics", headers=headers, timeout=5).text
    except httpx.HTTPError:
        return None
    for family in text_string_to_metric_families(text):
        if family.name == GAUGE and family.samples:
            return int(family.samples[0].value)
    return None


class LocalAutoscaler:
    def __init__(self, stack: Stack, bounds: tuple[int, int], desired: Callable[[], int | None]) -> None:
        self.stack = stack
        self.low, self.high = bounds
        self.desired = desired
        self.draining: dict[str, subprocess.Popen[bytes]] = {}
        self.events: list[tuple[str, str]] = []  # ("out" | "in", child name), in order

    def workers(self) -> list[str]:
        """The worker children running and not draining, by index."""
        names = [n for n in self.stack.children if n.startswith("worker")]
        return sorted(names, key=lambda n: int(n.removeprefix("worker")))

    def tick(self) -> None:
        """Reap drained workers, then move one worker toward the desired count."""
        for name, child in list(self.draining.items()):
            if child.poll() is not None:
                log.warning("%s drained and exited with %s", name, child.returncode)
                del self.draining[name]
        wanted = self.desired()
        if wanted is None:
            return
        wanted = min(max(wanted, self.low), self.high)
        running = self.workers()
        if wanted > len(running):
            taken = {int(n.removeprefix("worker")) for n in (*running, *self.draining)}
            name = self.stack.spawn_worker(min(set(range(1, self.high + len(taken) + 2)) - taken))
            self.events.append(("out", name))
            log.warning("scaling out: %s (desired %d)", name, wanted)
        elif wanted < len(running):
            name = running[-1]
            child = self.stack.children.pop(name)  # not the stack's to restart any more
            child.send_signal(signal.SIGTERM)  # the drain
            self.draining[name] = child
            self.events.append(("in", name))
            log.warning("scaling in: draining %s (desired %d)", name, wanted)

    def close(self, timeout_s: float = 30.0) -> None:
        """Wait for the workers still draining (the stack stops the rest)."""
        for child in self.draining.values():
            try:
                child.wait(timeout_s)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        self.draining.clear()
