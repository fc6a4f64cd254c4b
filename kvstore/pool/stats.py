"""A point-in-time snapshot of a block pool's counters."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class PoolStats:
    block_size: int
    blocks_total: int
    blocks_used: int  # ref_cnt > 0
    blocks_cached: int  # ref_cnt == 0 and hashed
    blocks_free: int  # ref_cnt == 0 and unhashed
    blocks_peak_used: int
    prefix_cache_queries_tokens: int
    prefix_cache_hits_tokens: int
    fragmentation: float  # unfilled share of the slots in used blocks

    @property
    def usage(self) -> float:
        return self.blocks_used / self.blocks_total

    @property
    def prefix_hit_rate(self) -> float:
        if self.prefix_cache_queries_tokens == 0:
            return 0.0
        return self.prefix_cache_hits_tokens / self.prefix_cache_queries_tokens

    def to_dict(self) -> dict[str, int | float]:
        out: dict[str, int | float] = asdict(self)
        out["usage"] = self.usage
        out["prefix_hit_rate"] = self.prefix_hit_rate
        return out
