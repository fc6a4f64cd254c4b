"""Logits processors: what changes a row's logits before a token is drawn from it (penalties,
biases, grammar masks). They run batched over the rows that need them, out of place: the engine
reads raw logprobs from the logits it was given (as vLLM's default, before any processor)."""

from __future__ import annotations

from collections.abc import Collection

import torch

from workers.engine.grammar import masks
from workers.engine.requests.sequence import EngineRequest
from workers.engine.sampling import penalties


def apply(
    logits: torch.Tensor, seqs: list[EngineRequest], eos_token_ids: Collection[int] = ()
) -> torch.Tensor:
    """logits [N, vocab], one row per seq; returns the processed logits (a new tensor when any
    row changes, else `logits` itself). Never modifies `logits` in place. eos_token_ids: what
    min_tokens holds back besides each request's stop_token_ids (unless it ignores EOS)."""
    logits = penalties.apply(logits, seqs, eos_token_ids)
    # the grammar masks last: no bias or penalty may bring back a token they rule out
    return masks.apply(logits, [s.grammar for s in seqs])
