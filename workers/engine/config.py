"""Engine configuration: one frozen dataclass that validates itself."""

from __future__ import annotations

from dataclasses import dataclass

from broker.defaults import DEFAULTS
from workers.engine.model.dtype_names import DTYPES, KV_DTYPES, QUANTIZATIONS


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str = DEFAULTS.model
    served_model_name: str | None = None  # the name requests use; default: `model`
    cache_size_bytes: int = int(DEFAULTS.cache_size)
    block_size: int = DEFAULTS.block_size
    max_num_seqs: int = DEFAULTS.max_num_seqs
    max_num_batched_tokens: int = DEFAULTS.max_num_batched_tokens  # per-step token budget (chunked prefill)
    # Prefill tokens in a step that also carries decodes: a long prompt chunk stretches every
    # decode's step (TPOT). None: only max_num_batched_tokens applies.
    max_prefill_tokens_with_decodes: int | None = DEFAULTS.max_prefill_tokens_with_decodes
    # Admission hold (scheduler.py): while others decode, new interactive prompts wait to be
    # prefilled together, the oldest's predicted TTFT bounded by this many times the predicted
    # prefill of a full batch of prompts like them (step_cost.py). 0: admit at once.
    prefill_batch_hold: float = DEFAULTS.prefill_batch_hold
    # Batch sizing (batch_budget.py): while interactive requests flow, a step's batch rows cost at
    # most (this - 1) times the predicted step without them (step_cost.py). 0: never sized.
    interactive_batch_step: float = DEFAULTS.interactive_batch_step
    # ... and a step that carried batch rows alone is followed by an idle gap, so such steps take
    # at most this share of the time (the loop takes a message at once during the gap). 1: no gap.
    interactive_batch_duty: float = DEFAULTS.interactive_batch_duty
    max_model_len: int | None = None  # None: the model's own context length
    enable_prefix_caching: bool = DEFAULTS.enable_prefix_caching
    # A bare engine (tests, benchmarks) has no warm tier and no max_tokens default unless given;
    # a worker gets Settings' (warm_cache_size, default_max_tokens).
    warm_cache_size_bytes: int = 0  # host-memory tier for blocks evicted from the pool; 0 = none
    # auto | float32 | bfloat16 | float16: auto is bf16 where the device computes it natively
    # (workers/engine/model/precision.py). kv_cache_dtype: the hot pool's K/V; auto follows dtype.
    dtype: str = DEFAULTS.dtype
    kv_cache_dtype: str = DEFAULTS.kv_cache_dtype
    # none | int8: the decoder linears' weights quantised at load time (kernels/int8_linear.py)
    quantization: str = DEFAULTS.quantization
    device: str = DEFAULTS.device
    torch_threads: int | None = None  # None: leave torch's default
    # CPU fp32: the model's linears on kvferry's decode-step GEMM, else weights packed for oneDNN
    # (workers/engine/packed_linear); in place, so every engine over the same loaded model shares it.
    packed_linear: bool = DEFAULTS.packed_linear
    # CPU fp32: decodes attend over the pool in place, with workers/engine/decode_kernel's C++
    # kernel (built on first use); off, or where it cannot build: index_select + SDPA.
    decode_kernel: bool = DEFAULTS.decode_kernel
    # CPU fp32, with both above: a decode-only step's decoder stack in one C++ call
    # (workers/engine/fused_decoder); off: transformers' modules around the same kernels.
    fused_decode: bool = DEFAULTS.fused_decode
    # After a step that gave a request its first token, the loop (EngineLoop) waits up to this long
    # for the consumers that report it (RequestHandle.first_out) to have published it: the next
    # step would fill the cores meanwhile. 0: never waits.
    first_token_hold_s: float = DEFAULTS.first_token_hold_s
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
        cap = self.max_prefill_tokens_with_decodes
        if cap is not None and cap < 1:
            raise ValueError(f"max_prefill_tokens_with_decodes must be None or >= 1, got {cap}")
        if not 0.0 <= self.prefill_batch_hold <= 10.0:
            raise ValueError(f"prefill_batch_hold must be in [0, 10], got {self.prefill_batch_hold}")
        if self.interactive_batch_step != 0.0 and not 1.0 <= self.interactive_batch_step <= 100.0:
            raise ValueError(
                f"interactive_batch_step must be 0 or in [1, 100], got {self.interactive_batch_step}"
            )
        if not 0.05 <= self.interactive_batch_duty <= 1.0:
            raise ValueError(
                f"interactive_batch_duty must be in [0.05, 1], got {self.interactive_batch_duty}"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype}")
        if self.kv_cache_dtype not in KV_DTYPES:
            raise ValueError(
                f"kv_cache_dtype must be one of {', '.join(KV_DTYPES)}, got {self.kv_cache_dtype}"
            )
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {self.quantization}"
            )
        if not 0.0 <= self.first_token_hold_s <= 60.0:
            raise ValueError(f"first_token_hold_s must be in [0, 60], got {self.first_token_hold_s}")
        if not 0.0 <= self.debug_slow_step_s < 3600.0:
            raise ValueError(f"debug_slow_step_s must be in [0, 3600), got {self.debug_slow_step_s}")
        if self.debug_crash_step < 0:
            raise ValueError(f"debug_crash_step must be >= 0, got {self.debug_crash_step}")
