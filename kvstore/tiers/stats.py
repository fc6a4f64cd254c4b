"""Point-in-time snapshots of the warm (host) and cold (Redis) tiers' counters."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class WarmTierStats:
    blocks: int
    bytes: int  # kv bytes held now
    capacity_bytes: int
    hits: int  # blocks returned by get / get_run
    misses: int  # blocks asked for and not returned
    evictions: int  # blocks dropped to stay under the capacity

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class RedisTierStats:
    """bytes_stored and packs are read from Redis (all workers of the model); the rest count what
    this process's tier did since it was built."""

    bytes_stored: int  # pack bytes, from the shared counter
    packs: int
    capacity_bytes: int
    blocks_written: int
    bytes_written: int
    blocks_read: int  # blocks in the packs fetched, used or not
    bytes_read: int
    read_hits: int  # blocks returned by get_run
    read_misses: int  # blocks asked of get_run and not returned
    packs_dropped: int  # corrupt or foreign packs found and deleted
    packs_evicted: int  # by this process's puts and unpins, to keep under the capacity
    write_oom_retries: int  # transactions Redis refused over its maxmemory, sent again (redis_tier.py)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)
