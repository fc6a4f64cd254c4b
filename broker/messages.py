"""Typed messages that cross process boundaries: jobs, results, and a job's stream events.

Each is a frozen msgspec Struct that refuses unknown fields; broker/codec.py turns them into JSON
(or JSON-safe builtins for Celery's arguments and results) and back, checking every type. A field
added later needs a default, so that a message from an older producer still decodes."""

from __future__ import annotations

from typing import Literal

import msgspec

from broker.priority import JobClass
from broker.sampling import SamplingParams

Endpoint = Literal["chat", "completion"]


class Message(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Base of every broker message (subclasses inherit its strictness)."""


class StreamEventBase(Message, frozen=True, tag_field="event"):
    """A job stream's event: its type travels under "event", so a reader dispatches on it."""


class ToolCall(Message, frozen=True):
    """A function call an assistant message made (OpenAI's tool_calls[i]); arguments is JSON text."""

    id: str
    name: str
    arguments: str


class ToolSpec(Message, frozen=True):
    """A function the model may call (OpenAI's tools[i].function); parameters is a JSON schema as
    JSON text ("" when the tool takes none)."""

    name: str
    description: str = ""
    parameters: str = ""


class ChatMessage(Message, frozen=True):
    role: str
    content: str  # "" for an assistant message that only calls tools (OpenAI's content: null)
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant's calls
    tool_call_id: str | None = None  # a tool message: the call it answers


class TopLogprob(Message, frozen=True, array_like=True):
    """One of the likeliest tokens at a position: its id, its text and its log-probability."""

    token_id: int
    text: str
    logprob: float


class TokenLogprob(Message, frozen=True, array_like=True):
    """A token's log-probability under the model's raw logits (before temperature, penalties and
    masks), with the likeliest `top` alternatives when asked. logprob is None for a prompt's first
    token (nothing predicts it)."""

    token_id: int
    text: str
    logprob: float | None = None
    top: tuple[TopLogprob, ...] = ()


class GenerateJob(Message, frozen=True):
    """What `kvferry.generate` takes. Exactly one of messages, prompt, prompt_token_ids is set."""

    model: str
    endpoint: Endpoint = "completion"
    messages: tuple[ChatMessage, ...] = ()
    prompt: str | None = None
    prompt_token_ids: tuple[int, ...] = ()
    params: SamplingParams = msgspec.field(default_factory=SamplingParams)
    session_id: str | None = None
    tenant: str = ""
    submitted_at: float = 0.0  # unix time at the api, for queue-wait figures
    pin_prefix: bool = False  # keep the prompt's blocks in the Redis tier for good (`kvferry preload`)
    cache_salt: str = ""  # as vLLM's: requests with different salts never share KV blocks
    echo: bool = False  # the result carries the prompt's text (prompt_text), as completions' echo
    tools: tuple[ToolSpec, ...] = ()  # a chat's tools, rendered by the chat template
    # Who goes first (broker/priority.py): the class, then vLLM's priority (lower is earlier).
    job_class: JobClass = "interactive"
    priority: int = 0
    batch_id: str = ""  # the Batch API batch a line belongs to ("" for any other job)
    # A session's turn K under session_move_after_turns = K: the worker its turn K+1 moves to,
    # which this turn's worker hints once the turn's blocks are in Redis ("": none).
    prefetch_to: str = ""

    @property
    def kv_salt(self) -> str:
        """What roots the job's block hashes and prefix digests: its tenant, and its cache_salt."""
        return f"{self.tenant}\x00salt:{self.cache_salt}" if self.cache_salt else self.tenant


class Usage(Message, frozen=True):
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


class GenerateResult(Message, frozen=True):
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
    logprobs: tuple[TokenLogprob, ...] = ()  # one per output token, when params.logprobs is set
    prompt_logprobs: tuple[TokenLogprob, ...] = ()  # one per prompt token, when params.prompt_logprobs is
    prompt_text: str = ""  # the prompt as text, when the job asked for echo


class TokenDelta(StreamEventBase, frozen=True, tag="delta"):
    """New output since the last event; text may lag tokens by an incomplete character.

    start and text_start index its first token and character in the whole output (-1: right
    after the previous delta), so a reader shows each once across redeliveries; epoch is the
    lease epoch that wrote it (broker/jobs/lease.py)."""

    text: str
    token_ids: tuple[int, ...]
    start: int = -1
    text_start: int = -1
    epoch: int = 0
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token of token_ids, when the job asked
    # On the delta that starts the output (start 0) of a job that asked: its prompt, for echo.
    prompt_logprobs: tuple[TokenLogprob, ...] = ()
    prompt_text: str = ""


class JobDone(StreamEventBase, frozen=True, tag="done"):
    result: GenerateResult
    epoch: int = 0


class JobFailed(StreamEventBase, frozen=True, tag="failed"):
    error_type: str  # e.g. "invalid_request_error", "server_error"
    message: str
    status_code: int  # the HTTP status the api answers with
    param: str | None = None
    epoch: int = 0


StreamEvent = TokenDelta | JobDone | JobFailed


class EngineFigures(Message, frozen=True):
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
    # Seconds of decode-only steps and of steps with prefill rows; steps that held prompts back.
    seconds_decode_only: float = 0.0
    seconds_with_prefill: float = 0.0
    num_held_steps: int = 0
    # Prompt tokens its running sequences have not computed yet (chunked prefills under way; a
    # waiting one's cache hit is not known before it is scheduled): prefill ahead of a new job.
    prefill_tokens_pending: int = 0
    # Running sequences sent back to wait (their blocks freed) so others could grow: the pool full.
    num_preemptions: int = 0
    # Of pool_blocks_used: kept session tails (given back first when the pool runs short), so the
    # running sequences hold used - kept; and how long the sequence waiting longest in the engine
    # without having started has waited (for a seat or pool room): the policy's room and wait.
    pool_blocks_kept: int = 0
    oldest_waiting_s: float = 0.0
    # The precision it computes in (weights and GEMMs) and holds its hot K/V in.
    dtype: str = "float32"
    kv_cache_dtype: str = "float32"

    @property
    def kv_usage(self) -> float:
        return self.pool_blocks_used / self.pool_blocks_total if self.pool_blocks_total else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        q = self.prefix_cache_queries_tokens
        return self.prefix_cache_hits_tokens / q if q else 0.0


class WorkerStatus(Message, frozen=True):
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
    concurrency: int = 0  # jobs it runs at once (worker_concurrency); 0: unknown (an older worker)
    seats: int = 0  # sequences its engine steps at once (max_num_seqs); 0: unknown (as concurrency)
    warm_start_blocks: int = 0  # loaded from the Redis tier before it took work (warm_start.py)
    warm_start_bytes: int = 0

    @property
    def state(self) -> Literal["loading", "ready"]:
        return "ready" if self.engine is not None else "loading"


class SessionRecord(Message, frozen=True):
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
    next_worker: str = ""  # where the forced move after this turn goes (the hinted worker), if ready
