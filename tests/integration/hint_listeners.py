"""Waiting for a worker's prefetch-hint listener (workers/tiers/prefetch.py HintListener) to have
loaded a hint: it blocks in BLPOP on its list between hints (nothing else in kvferry BLPOPs), so
one that took a hint is back in BLPOP once the hint's blocks are in its warm tier."""

from __future__ import annotations

import time

import redis


def waiting_listeners(client: redis.Redis) -> int:
    """Listeners blocked in BLPOP now."""
    return sum(1 for c in client.client_list() if c.get("cmd") == "blpop" and "b" in c.get("flags", ""))


def listeners(client: redis.Redis) -> int:
    """How many listeners there are: the most seen blocked over one BLPOP timeout (each leaves it
    only for an instant between two)."""
    seen, deadline = 0, time.monotonic() + 1.2
    while time.monotonic() < deadline:
        seen = max(seen, waiting_listeners(client))
        time.sleep(0.05)
    return seen
