"""Token masks for the rows of a batch that follow a grammar: filled by llguidance (several rows
at once on its thread pool), unpacked to booleans and applied to those rows alone, out of place.
Rows without a grammar cost a list scan."""

from __future__ import annotations

import functools

import llguidance
import numpy as np
import torch

from workers.engine.grammar.matcher import GrammarMatcher


@functools.cache
def _executor() -> llguidance.LLExecutor:
    return llguidance.LLExecutor()


def forbidden(matchers: list[GrammarMatcher], vocab: int) -> torch.Tensor:
    """bool [len(matchers), vocab]: which token ids each matcher rules out next (ids past its
    tokenizer's vocabulary always). Raises RequestFailedError for a matcher that broke."""
    words = max(m.mask_words for m in matchers)
    bitmask = np.zeros((len(matchers), words), dtype=np.int32)  # bit j of word w: token 32 * w + j
    if len(matchers) == 1:
        matchers[0].ll.unsafe_compute_mask_ptr(bitmask.ctypes.data, bitmask.nbytes)
    else:
        rows = [(m.ll, i) for i, m in enumerate(matchers)]
        _executor().unsafe_compute_mask_ptr(rows, bitmask.ctypes.data, words * 4, len(matchers))
    for m in matchers:
        m.check()
    bits = np.unpackbits(bitmask.view(np.uint8), axis=1, count=vocab, bitorder="little")  # [N, vocab]
    return torch.from_numpy(bits == 0)


def apply(logits: torch.Tensor, matchers: list[GrammarMatcher | None]) -> torch.Tensor:
    """logits [N, vocab], matchers[i] row i's (None: unconstrained). Returns `logits` itself when
    no row has one, else a new tensor whose constrained rows are -inf wherever not allowed."""
    rows = [i for i, m in enumerate(matchers) if m is not None]
    if not rows:
        return logits
    mask = forbidden([m for m in matchers if m is not None], logits.shape[-1]).to(logits.device)
    if len(rows) == logits.shape[0]:
        return logits.masked_fill(mask, float("-inf"))
    out = logits.clone()  # the one full-size op: the other rows' logits are copied, not processed
    for row, ruled_out in zip(rows, mask, strict=True):
        out[row].masked_fill_(ruled_out, float("-inf"))
    return out
