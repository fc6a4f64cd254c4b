"""TierConfig: the worker's shared Redis KV tier, fixed at start-up. Torch-free (Settings builds it)."""

from __future__ import annotations

from dataclasses import dataclass

from broker.defaults import DEFAULTS


@dataclass(frozen=True, slots=True)
class TierConfig:
    redis_capacity_bytes: int = int(DEFAULTS.redis_cache_size)  # the tier's byte cap; 0 = no Redis tier
    session_ttl_s: int = DEFAULTS.session_ttl_s
    tenant_kv_quota_bytes: int = 0  # session-pinned bytes per tenant in the Redis tier; 0 = no quota
    prefix_digests_kept: int = 50_000  # per worker, for routing
    kv_write_queue_bytes: int = int(DEFAULTS.kv_write_queue_size)  # the KV writer's bound (kv_writer.py)
    kv_write_defer_s: float = DEFAULTS.kv_write_defer_s  # how long the writer may yield to the engine
    warm_start_bytes: int = int(DEFAULTS.warm_start_size)  # workers/tiers/warm_start.py; 0 = off
    host_heap_reserve_bytes: int = int(DEFAULTS.host_heap_reserve)  # workers/process/host_heap.py; 0 = none
    tier_dtype: str = (
        DEFAULTS.kv_tier_dtype
    )  # how blocks are stored in Redis: exact | int8 | fp16 | bf16 (kvstore/tiers/quant.py)
