"""EngineRequest: the state of one request inside the engine (its tokens, blocks and progress)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from broker.priority import JobClass
from broker.sampling import SamplingParams
from kvstore.chain import BlockHash
from workers.engine.requests.logprob import Logprob

if TYPE_CHECKING:
    from workers.engine.grammar.matcher import GrammarMatcher

FinishReason = Literal["stop", "length", "abort", "error"]


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class EngineRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    max_tokens: int  # resolved: params.max_tokens or what the context leaves
    cache_salt: str = ""
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V are in the pool
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[BlockHash] = field(default_factory=list)  # of the full, committed blocks
    # All full blocks but the last token's, hashed (BlockManager.prefix_hashes memoises them here).
    prefix_hashes: list[BlockHash] = field(default_factory=list)
    # Prompt tokens found at first admission, by where: the pool (-1 = not admitted yet), the
    # host-memory tier (blocks it held itself) and Redis (blocks a prefetch brought into it).
    num_cached_tokens: int = -1
    num_warm_tokens: int = 0
    num_redis_tokens: int = 0
    num_tail_redis_tokens: int = 0  # of the pool's: a kept tail that came from Redis (a moved turn)
    num_preemptions: int = 0
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    output_text: str = ""
    num_streamed_chars: int = 0
    # The prompt's log-probabilities (params.prompt_logprobs), from its second token on, filled as
    # its prefill computes them; sent once, with the first output after they are complete.
    prompt_logprobs: list[Logprob] = field(default_factory=list)
    prompt_logprobs_sent: bool = False
    grammar: GrammarMatcher | None = None  # params.structured_outputs' matcher: masks and advances
    # Its place in the waiting order (workers/engine/scheduling/wait_queue.py): interactive before batch,
    # then lower priority first (vLLM's); a running batch sequence yields to a waiting interactive.
    job_class: JobClass = "interactive"
    priority: int = 0

    @property
    def is_batch(self) -> bool:
        return self.job_class == "batch"

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """token_ids[start:end] without building the whole list (the runner calls it every step)."""
        p = len(self.prompt_token_ids)
        if start >= p:
            return self.output_token_ids[start - p : end - p]
        if end <= p:
            return self.prompt_token_ids[start:end]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - p]

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def needs_prompt_logits(self) -> bool:
        """Its prompt's logprobs are asked for and not all computed: a cache holds K/V, not
        logits, so such a prompt is computed whole, never taken from a cache."""
        wanted = self.params.prompt_logprobs is not None
        return wanted and len(self.prompt_logprobs) < self.num_prompt_tokens - 1

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens
