"""Typed messages that cross process boundaries: jobs, results, and a job's stream events."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from broker.sampling import SamplingParams

Endpoint = Literal["chat", "completion"]


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True, slots=True)
class GenerateJob:
    """What `kvferry.generate` takes. Exactly one of messages, prompt, prompt_token_ids is set."""

    model: str
    endpoint: Endpoint = "completion"
    messages: tuple[ChatMessage, ...] = ()
    prompt: str | None = None
    prompt_token_ids: tuple[int, ...] = ()
    params: SamplingParams = field(default_factory=SamplingParams)
    session_id: str | None = None
    tenant: str = ""
    submitted_at: float = 0.0  # unix time at the api, for queue-wait figures
    pin_prefix: bool = False  # keep the prompt's blocks in the Redis tier for good (`kvferry preload`)
    cache_salt: str = ""  # as vLLM's: requests with different salts never share KV blocks

    @property
    def kv_salt(self) -> str:
        """What roots the job's block hashes and prefix digests: its tenant, and its cache_salt."""
        return f"{self.tenant}\x00salt:{self.cache_salt}" if self.cache_salt else self.tenant


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts. cached_tokens = prompt tokens not computed, from whichever source had them."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    pool_tokens: int = 0  # found in the worker's own pool
    warm_tokens: int = 0  # in its host-memory tier
    redis_tokens: int = 0  # fetched from the Redis tier
    # A redelivered job (resumed on another worker, or after an engine restart): how many of its
    # prompt + already-streamed output tokens had to be computed again (0 for a first attempt).
    recomputed_tokens: int = 0

    @property
    def computed_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class GenerateResult:
    """What `kvferry.generate` returns (the Celery task result)."""

    job_id: str
    model: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    usage: Usage
    worker: str
    queue_wait_s: float
    ttft_s: float
    latency_s: float


@dataclass(frozen=True, slots=True)
class TokenDelta:
    """New output since the last event; text may lag tokens by an incomplete character.

    start and text_start index its first token and character in the whole output (-1: right
    after the previous delta), so a reader shows each once across redeliveries; epoch is the
    lease epoch that wrote it (broker/job_lease.py)."""

    text: str
    token_ids: tuple[int, ...]
    start: int = -1
    text_start: int = -1
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class JobDone:
    result: GenerateResult
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class JobFailed:
    error_type: str  # e.g. "invalid_request_error", "server_error"
    message: str
    status_code: int  # the HTTP status the api answers with
    param: str | None = None
    epoch: int = 0


StreamEvent = TokenDelta | JobDone | JobFailed


@dataclass(frozen=True, slots=True)
class EngineFigures:
    """A worker engine's load and KV figures, as of its last heartbeat."""

    num_running: int
    num_waiting: int
    num_steps: int
    max_batch_seqs: int
    generation_tokens: int
    pool_blocks_total: int
    pool_blocks_used: int
    pool_blocks_cached: int
    bytes_per_block: int
    prefix_cache_queries_tokens: int
    prefix_cache_hits_tokens: int
    fragmentation: float
    weights_bytes: int
    pool_bytes: int

    @property
    def kv_usage(self) -> float:
        return self.pool_blocks_used / self.pool_blocks_total if self.pool_blocks_total else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        q = self.prefix_cache_queries_tokens
        return self.prefix_cache_hits_tokens / q if q else 0.0


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    """A worker's heartbeat: liveness and load (Redis, Flower, /metrics, `kvferry ping`)."""

    name: str
    queue: str
    model: str
    jobs_running: int
    jobs_done: int
    jobs_failed: int
    sent_at: float
    engine: EngineFigures | None = None  # None until the engine is built (first job)
    healthy: bool = True  # False while its engine loop is dead or restarting after a failed step

    @property
    def state(self) -> Literal["loading", "ready"]:
        return "ready" if self.engine is not None else "loading"


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """A conversation as Redis keeps it, so that any worker can resume it: the tokens so far and
    their block-hash chain (hex), who served it last and when. Block ids never leave a pool."""

    session_id: str
    tenant: str
    model: str
    token_ids: tuple[int, ...]
    block_hashes: tuple[str, ...]
    last_worker: str
    last_used: float
    turns: int
