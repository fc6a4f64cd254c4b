"""Prefetch: pull a prompt's blocks from the Redis tier into the warm tier before the job reaches
the engine, on the submitting thread, so the engine thread never waits on Redis."""

from __future__ import annotations

from kvstore.block_hash import hash_blocks, root_hash
from kvstore.redis_tier import RedisTier
from workers.engine.llm_engine import LLMEngine


def prefetch(engine: LLMEngine, tier: RedisTier, ids: list[int], tenant: str) -> int:
    """Fetch the blocks of `ids` that neither the pool nor the warm tier holds; returns how many."""
    tiers = engine.tiers
    if tiers is None:
        return 0
    bs = engine.pool.block_size
    n_blocks = (len(ids) - 1) // bs  # the last prompt token is always computed
    if n_blocks == 0:
        return 0
    hashes = hash_blocks(ids[: n_blocks * bs], bs, (), parent=root_hash((engine.loaded.fingerprint, tenant)))
    first = 0  # reads of engine-owned indexes: a stale answer costs a fetch or a recompute, never a token
    while first < n_blocks and (
        hashes[first] in tiers.warm
        or engine.pool.get_cached_block(hashes[first], ids[first * bs : (first + 1) * bs]) is not None
    ):
        first += 1
    if first == n_blocks:
        return 0
    run = tier.get_run(hashes[first:], [ids[i * bs : (i + 1) * bs] for i in range(first, n_blocks)])
    for block in run:
        tiers.warm.put(block)
    tiers.from_redis.update(b.block_hash for b in run)
    tiers.mark_persisted([b.block_hash for b in run])
    return len(run)
