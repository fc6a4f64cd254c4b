"""Pins of the cold tier, by owner: a tenant's session (or its preloaded prompts) pins an exact set
of blocks, kept in the KV Redis next to the blocks. Torch-free (redis only): the API releases a
deleted session's pins with release_session, the worker sweep releases expired ones.

Accounting: an owner's pinned bytes are its pinned blocks times the KV bytes of one block, summed
per tenant in TierKeys.tenant_bytes; a tenant over its quota loses its own least recently pinned
owners first (lua/prelude.lua: enforce_quota). Pinned packs count against the tier's byte cap.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

from kvstore.redis import nodes, scripts
from kvstore.redis.client import KVClient
from kvstore.redis.keys import TIER_REGISTRY, PinOwner, TierKeys


@dataclass(frozen=True, slots=True)
class PinChange:
    added: int  # blocks newly pinned by the owner
    removed: int  # blocks it no longer pins (they left its chain)
    owners_released: int  # whole owners of its tenant released to keep within the quota
    packs_evicted: int
    stale: bool  # refused: a newer turn already set this owner's pins


def pin_owner(
    client: KVClient,
    keys: TierKeys,
    owner: PinOwner,
    hashes: Sequence[bytes],
    *,
    block_bytes: int,
    capacity_bytes: int,
    quota_bytes: int = 0,
    replace: bool = True,
    version: float | None = None,
) -> PinChange:
    """Set (replace) or extend the owner's pins to the indexed blocks among ``hashes``."""
    args: list[Any] = [
        owner.tenant,
        owner.id,
        repr(time.time() if version is None else version),
        block_bytes,
        capacity_bytes,
        quota_bytes,
        1 if replace else 0,
        *hashes,
    ]
    raw = scripts.TierScript(client, scripts.PIN_OWNER)(keys.namespace(), args)
    added, removed, released, evicted, stale, dropped = cast("list[Any]", raw)
    if dropped:  # a cluster's packs it evicted: on their own shards
        nodes.unlink(client, dropped)
    return PinChange(int(added), int(removed), int(released), int(evicted), bool(stale))


def release(client: KVClient, keys: TierKeys, owners: Sequence[PinOwner]) -> int:
    """Every pin of the owners goes at once; returns the blocks unpinned. Idempotent."""
    if not owners:
        return 0
    args = [x for owner in owners for x in (owner.tenant, owner.id)]
    return int(cast("int", scripts.TierScript(client, scripts.RELEASE_OWNER)(keys.namespace(), args)))


def fingerprints(client: KVClient) -> list[str]:
    """Every model that has a tier in this Redis."""
    members = cast("set[bytes]", client.smembers(TIER_REGISTRY))
    return sorted(m.decode() for m in members)


def release_session(client: KVClient, tenant: str, session_id: str) -> int:
    """Release the session's pins in the tier of every model (the caller need not know which model's
    fingerprint its blocks were hashed under); returns the blocks unpinned."""
    owner = PinOwner.session(tenant, session_id)
    return sum(release(client, TierKeys(fp), [owner]) for fp in fingerprints(client))


def owners(client: KVClient, keys: TierKeys) -> Iterator[tuple[PinOwner, float]]:
    """Every owner holding pins in this tier, with the time of its last pin."""
    start = len(keys.owners(""))
    for key in nodes.scan_slot(client, keys.owners("*"), keys.index):
        tenant = key[start:].decode()
        for raw, score in cast("list[tuple[bytes, float]]", client.zrange(key, 0, -1, withscores=True)):
            owner = PinOwner.parse(raw.decode())
            if owner.tenant == tenant:
                yield owner, float(score)


def pinned_bytes_by_tenant(client: KVClient, keys: TierKeys) -> dict[str, int]:
    raw = cast("dict[bytes, bytes]", client.hgetall(keys.tenant_bytes))
    return {t.decode(): int(n) for t, n in sorted(raw.items())}
