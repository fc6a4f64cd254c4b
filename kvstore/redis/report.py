"""read_report: the Redis tier as every process sees it (torch-free: `kvferry stats`, /metrics).

Counters live in the KV Redis (TierKeys.counters), raised by every worker's tier. Pins are checked
against the sessions in the queue Redis: a session pin whose session has no entry in
SESSION_EXPIRY at all is an orphan (nobody will ever release it: must be 0); one whose session
expired but is not swept yet is pending (the next sweep releases it).
"""

from __future__ import annotations

import time
from typing import Any, cast

import redis

from broker import keys
from kvstore.redis import pins as tier_pins
from kvstore.redis.client import KVClient
from kvstore.redis.keys import READ_CAUSES, TierKeys

# writes_dropped: raised by the workers' writers (workers/tiers/writer.py), not by the tier itself
COUNTERS = (
    "hits",
    "misses",
    "bytes_read",
    "bytes_written",
    "blocks_written",
    "packs_evicted",
    "writes_dropped",
    "blocks_fetched",
    *(f"bytes_read_{cause}" for cause in READ_CAUSES),
)


def read_report(
    kv_client: KVClient,
    queue_client: redis.Redis,
    fingerprint: str | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """Totals over every model's tier in the KV Redis (or only ``fingerprint``'s):
    hits, misses (blocks), bytes_read, bytes_written, blocks_written, packs_evicted, writes_dropped,
    bytes_stored,
    packs, pinned_bytes_by_tenant, pinned_sessions, orphan_pins, pending_pins, and per model
    ``models: {fingerprint: {bytes_stored, packs}}``."""
    now = time.time() if now is None else now
    report: dict[str, Any] = dict.fromkeys(COUNTERS, 0)
    report.update(bytes_stored=0, packs=0, pinned_sessions=0, orphan_pins=0, pending_pins=0)
    by_tenant: dict[str, int] = {}
    models: dict[str, dict[str, int]] = {}
    for fp in [fingerprint] if fingerprint else tier_pins.fingerprints(kv_client):
        k = TierKeys(fp)
        pipe = kv_client.pipeline(transaction=False)
        pipe.hgetall(k.counters)
        pipe.get(k.bytes)
        pipe.zcard(k.lru)
        counters, stored, packs = pipe.execute()
        for name, value in cast("dict[bytes, bytes]", counters).items():
            if name.decode() in report:
                report[name.decode()] += int(value)
        models[fp] = {"bytes_stored": int(stored or 0), "packs": int(packs)}
        report["bytes_stored"] += int(stored or 0)
        report["packs"] += int(packs)
        for tenant, n in tier_pins.pinned_bytes_by_tenant(kv_client, k).items():
            by_tenant[tenant] = by_tenant.get(tenant, 0) + n
        sessions = [
            (owner, k.pinset(owner)) for owner, _ in tier_pins.owners(kv_client, k) if owner.kind == "s"
        ]
        if not sessions:
            continue
        pipe = queue_client.pipeline(transaction=False)
        for owner, _ in sessions:
            pipe.zscore(keys.SESSION_EXPIRY, keys.session_member(owner.tenant, owner.name))
        expiries = pipe.execute()
        pipe = kv_client.pipeline(transaction=False)
        for _, pinset in sessions:
            pipe.scard(pinset)
        for expiry, count in zip(expiries, pipe.execute(), strict=True):
            if expiry is None:
                report["orphan_pins"] += int(count)
            elif float(expiry) <= now:
                report["pending_pins"] += int(count)
            else:
                report["pinned_sessions"] += 1
    report["pinned_bytes_by_tenant"] = dict(sorted(by_tenant.items()))
    report["models"] = models
    return report
