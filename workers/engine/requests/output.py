"""RequestOutput: what one step says about one request (a delta, and the totals so far)."""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.errors import InvalidRequestError
from kvstore.chain import BlockHash
from workers.engine.requests.logprob import Logprob
from workers.engine.requests.sequence import FinishReason


@dataclass(frozen=True, slots=True)
class RequestOutput:
    request_id: str
    delta_token_ids: tuple[int, ...]
    delta_text: str
    finished: bool
    finish_reason: FinishReason | None
    token_ids: tuple[int, ...]  # every output token so far
    text: str
    prompt_tokens: int
    cached_tokens: int  # prompt tokens not computed: pool + warm tier + Redis
    pool_tokens: int = 0  # of which found in this worker's pool
    warm_tokens: int = 0  # ... in its host-memory tier
    redis_tokens: int = 0  # ... brought from Redis (by a prefetch)
    error: str | None = None
    # where delta_text starts in text (the characters streamed before it): a reader that holds
    # more drops the overlap, whatever a resumed request's detokenizer made of its first tokens
    text_start: int = -1
    # A finished request's chained block hashes, as the engine computed them block by block (its
    # full, computed blocks): the session keeper extends them instead of hashing the turn again.
    block_hashes: tuple[BlockHash, ...] = ()
    delta_logprobs: tuple[Logprob, ...] = ()  # of delta_token_ids, when the request asked
    # The prompt's (from its second token on), once, on the first output after they are complete.
    prompt_logprobs: tuple[Logprob, ...] = ()
    # Why the request failed alone (finish_reason "error"): the typed error its caller gets.
    cause: InvalidRequestError | None = field(default=None, compare=False, repr=False)

    @property
    def computed_prompt_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @property
    def token_start(self) -> int:
        """Index of delta_token_ids[0] among the output tokens."""
        return len(self.token_ids) - len(self.delta_token_ids)

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)
