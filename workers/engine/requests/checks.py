"""Admission checks for one request: what add_request refuses before anything is queued."""

from __future__ import annotations

from collections.abc import Sequence

from broker.errors import InvalidRequestError, PromptTooLongError
from broker.sampling import SamplingParams


def _check_ids(ids: Sequence[int], vocab_size: int, what: str, param: str) -> None:
    if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 or t >= vocab_size for t in ids):
        raise InvalidRequestError(f"{what} token ids must be integers in [0, {vocab_size})", param)


def check_request(
    prompt_token_ids: Sequence[int],
    params: SamplingParams,
    output_token_ids: Sequence[int],
    *,
    vocab_size: int,
    max_model_len: int,
    block_size: int,
    num_blocks: int,
    default_max_tokens: int | None = None,
) -> int:
    """Raise InvalidRequestError (naming the field) if the request cannot run; else return its
    max_tokens, resolved: params.max_tokens, or when None default_max_tokens capped by the room the
    context leaves (all of that room when default_max_tokens is None too)."""
    params.check()  # again: an instance may have skipped its constructor's checks
    if not prompt_token_ids:
        raise InvalidRequestError("the prompt is empty", "prompt")
    _check_ids(prompt_token_ids, vocab_size, "prompt", "prompt")
    _check_ids([token for token, _ in params.logit_bias], vocab_size, "logit_bias", "logit_bias")
    _check_ids(params.stop_token_ids, vocab_size, "stop_token_ids", "stop_token_ids")
    n = len(prompt_token_ids)
    room = max_model_len - n
    if room < 1:
        raise PromptTooLongError(
            f"the prompt has {n} tokens; the context holds {max_model_len} including at least "
            "one output token",
            "prompt",
        )
    if params.max_tokens is not None:
        max_tokens = params.max_tokens
    else:
        max_tokens = room if default_max_tokens is None else min(room, default_max_tokens)
    if n + max_tokens > max_model_len:
        raise PromptTooLongError(
            f"prompt ({n} tokens) + max_tokens ({max_tokens}) exceeds the context length ({max_model_len})",
            "max_tokens",
        )
    if (n + block_size) // block_size > num_blocks:  # blocks for n + 1 tokens, rounded up
        raise PromptTooLongError(
            f"the prompt has {n} tokens but the KV pool holds only "
            f"{num_blocks * block_size}: raise --cache-size",
            "prompt",
        )
    if output_token_ids:
        if len(output_token_ids) > max_tokens:
            raise InvalidRequestError(
                f"the resumed output has {len(output_token_ids)} tokens, over max_tokens", "max_tokens"
            )
        _check_ids(output_token_ids, vocab_size, "output", "output_token_ids")
    return max_tokens
