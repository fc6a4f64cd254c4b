"""Engine configuration: one frozen dataclass that validates itself."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str = "smollm2"
    served_model_name: str | None = None  # the name requests use; default: `model`
    cache_size_bytes: int = 512 * 1024**2
    block_size: int = 16
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 1024  # per-step token budget (chunked prefill)
    max_model_len: int | None = None  # None: the model's own context length
    enable_prefix_caching: bool = True
    warm_cache_size_bytes: int = 0  # host-memory tier for blocks evicted from the pool; 0 = none
    dtype: str = "float32"
    device: str = "cpu"
    torch_threads: int | None = None  # None: leave torch's default
    default_max_tokens: int | None = None  # a request naming no max_tokens; None: the room left
    # Fault hooks for tests: a step that computes prompt tokens sleeps this much longer, and the
    # N-th step (1-based) raises RuntimeError once. 0 disables each.
    debug_slow_step_s: float = 0.0
    debug_crash_step: int = 0

    def __post_init__(self) -> None:
        if self.default_max_tokens is not None and self.default_max_tokens < 1:
            raise ValueError(f"default_max_tokens must be None or >= 1, got {self.default_max_tokens}")
        if self.block_size < 1 or self.block_size > 1024:
            raise ValueError(f"block_size must be in [1, 1024], got {self.block_size}")
        if self.cache_size_bytes <= 0:
            raise ValueError(f"cache_size_bytes must be positive, got {self.cache_size_bytes}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < self.block_size:
            raise ValueError("max_num_batched_tokens must be at least one block")
        if self.dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"dtype must be float32, float16 or bfloat16, got {self.dtype}")
        if not 0.0 <= self.debug_slow_step_s < 3600.0:
            raise ValueError(f"debug_slow_step_s must be in [0, 3600), got {self.debug_slow_step_s}")
        if self.debug_crash_step < 0:
            raise ValueError(f"debug_crash_step must be >= 0, got {self.debug_crash_step}")
