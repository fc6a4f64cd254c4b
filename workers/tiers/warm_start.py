"""Warm start: a worker that joins the fleet loads the hottest prefixes from the Redis tier into its
warm tier before it takes any work (workers/process/main.py runs it between the engine's build and
the consumer's start; the heartbeat, which makes routing send it jobs, starts with the consumer).

"Hottest" comes from what the queue Redis records: the live sessions by their last use
(SESSION_EXPIRY, each session's expiry is its last use plus the session TTL), up to
MAX_CANDIDATES. Their block-hash chains (SessionRecord.block_hashes, the same hashes the engine
indexes) are loaded in two passes: first the blocks several of them share (system prompts,
templates), most shared first; then each session's own blocks, most recent session first. The
budget is the setting `warm_start_size` (bytes, capped by the warm tier's size). The blocks go
through the engine loop's `warm` message, the same path a prefetch takes (workers/tiers/prefetch.py)."""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from broker import keys
from broker.messages import SessionRecord
from broker.sessions import store as session_store

if TYPE_CHECKING:
    from kvstore.chain import BlockHash
    from kvstore.redis.tier import RedisTier
    from workers.tiers.prefetch import PrefetchTarget

log = logging.getLogger(__name__)

MAX_CANDIDATES = 256  # the most recent live sessions looked at


@dataclass(frozen=True, slots=True)
class WarmStartFigures:
    sessions: int = 0  # sessions whose blocks were looked up
    blocks: int = 0  # loaded from Redis into the warm tier
    bytes: int = 0
    seconds: float = 0.0


def hot_sessions(client: redis.Redis, model: str, limit: int = MAX_CANDIDATES) -> list[SessionRecord]:
    """The live sessions of `model`, most recently used first."""
    now = time.time()
    members: Any = client.zrevrangebyscore(keys.SESSION_EXPIRY, "+inf", f"({now}", start=0, num=limit)
    named = []
    for raw in members:
        try:
            named.append(keys.parse_session_member(raw.decode()))
        except ValueError:
            continue
    pipe = client.pipeline(transaction=False)
    for tenant, sid in named:
        pipe.get(keys.session(tenant, sid))
    records = []
    for (tenant, _), raw in zip(named, pipe.execute(), strict=True):
        record = session_store.decode(raw) if raw is not None else None
        if record is not None and record.tenant == tenant and record.model == model and record.block_hashes:
            records.append(record)
    return records


def _chain(record: SessionRecord, block_size: int) -> tuple[list[BlockHash], list[list[int]]]:
    """The record's block hashes with their tokens (the blocks its tokens fill)."""
    n = min(len(record.block_hashes), len(record.token_ids) // block_size)
    hashes = [bytes.fromhex(h) for h in record.block_hashes[:n]]
    ids = [list(record.token_ids[i * block_size : (i + 1) * block_size]) for i in range(n)]
    return hashes, ids


def warm_start(
    client: redis.Redis, target: PrefetchTarget, tier: RedisTier, model: str, budget_bytes: int
) -> WarmStartFigures:
    """Load the hottest prefixes into `target`'s warm tier, up to `budget_bytes`."""
    started = time.perf_counter()
    if budget_bytes <= 0 or target.resident is None:
        return WarmStartFigures()
    records = hot_sessions(client, model)
    chains = [_chain(r, target.block_size) for r in records]
    shared = Counter(h for hashes, _ in chains for h in set(hashes))
    # pass 1: the shared leading blocks of each chain, the most shared chains first; pass 2: all
    parts = [(hashes[:n], ids[:n]) for hashes, ids in chains if (n := _shared_len(hashes, shared))]
    parts.sort(key=lambda part: -shared[part[0][0]])
    blocks = loaded = 0
    for hashes, ids in [*parts, *chains]:
        if loaded >= budget_bytes:
            break
        first = target.resident.first_missing(hashes)
        if first == len(hashes):
            continue
        run = tier.get_run(hashes[first:], ids[first:], cause="warm_start")
        kept = []
        for block in run:
            if loaded >= budget_bytes:
                break
            kept.append(block)
            loaded += len(block.kv)
        target.warm(kept, at_request=False)
        blocks += len(kept)
    figures = WarmStartFigures(len(records), blocks, loaded, time.perf_counter() - started)
    log.info(
        "warm start: %d blocks (%d bytes) of %d sessions in %.2f s",
        blocks,
        loaded,
        len(records),
        figures.seconds,
    )
    return figures


def _shared_len(hashes: list[BlockHash], shared: Counter[BlockHash]) -> int:
    """How many leading blocks of a chain other sessions hold too."""
    n = 0
    while n < len(hashes) and shared[hashes[n]] > 1:
        n += 1
    return n
