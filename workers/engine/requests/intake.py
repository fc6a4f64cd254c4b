"""RequestLimits and new_sequence: a GenerationRequest checked against what the engine can run,
and its EngineRequest (the state the engine keeps of it) built in one go."""

from __future__ import annotations

from dataclasses import dataclass

from workers.engine.requests.checks import check_request
from workers.engine.requests.request import GenerationRequest
from workers.engine.requests.sequence import EngineRequest


@dataclass(frozen=True, slots=True)
class RequestLimits:
    vocab_size: int
    max_model_len: int
    block_size: int
    num_blocks: int
    default_max_tokens: int | None = None


def new_sequence(request: GenerationRequest, limits: RequestLimits) -> EngineRequest:
    """Raises InvalidRequestError (naming the field) when the request cannot run."""
    max_tokens = check_request(
        request.prompt_token_ids,
        request.params,
        request.output_token_ids,
        vocab_size=limits.vocab_size,
        max_model_len=limits.max_model_len,
        block_size=limits.block_size,
        num_blocks=limits.num_blocks,
        default_max_tokens=limits.default_max_tokens,
    )
    return EngineRequest(
        request.request_id,
        list(request.prompt_token_ids),
        request.params,
        max_tokens,
        request.cache_salt,
        job_class=request.job_class,
        priority=request.priority,
    )
