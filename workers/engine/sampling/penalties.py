"""Penalties and biases (vLLM's semantics), applied batched to the rows that ask for any.

In vLLM's order, which is also HF's (sequence_bias, repetition_penalty, min_new_tokens; a mask to
-inf commutes with the penalties): logit_bias is added; min_tokens masks EOS and stop_token_ids
while too few output tokens exist; then the repetition penalty over the prompt and output tokens
seen, and the frequency and presence penalties over the output tokens."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from itertools import chain

import torch

from broker.sampling import SamplingParams
from workers.engine.requests.sequence import EngineRequest


def _penalised(p: SamplingParams) -> bool:
    return p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0


def min_tokens_masked(seq: EngineRequest, eos_token_ids: Collection[int]) -> tuple[int, ...]:
    """The token ids min_tokens masks for seq's next token: none once min_tokens are out."""
    p = seq.params
    if len(seq.output_token_ids) >= p.min_tokens:
        return ()
    return (*p.stop_token_ids, *(() if p.ignore_eos else eos_token_ids))


def wants(seq: EngineRequest, eos_token_ids: Collection[int]) -> bool:
    p = seq.params
    return bool(p.logit_bias) or _penalised(p) or bool(min_tokens_masked(seq, eos_token_ids))


def apply(
    logits: torch.Tensor, seqs: Sequence[EngineRequest], eos_token_ids: Collection[int]
) -> torch.Tensor:
    """logits [N, vocab], one row per seq. Returns `logits` itself when no row wants any of these,
    else a new tensor; `logits` is never modified."""
    rows = [i for i, s in enumerate(seqs) if wants(s, eos_token_ids)]
    if not rows:
        return logits
    chosen = [seqs[i] for i in rows]
    every_row = len(rows) == logits.shape[0]
    index = torch.tensor(rows, device=logits.device)
    x = logits.clone() if every_row else logits.index_select(0, index)  # [R, vocab], ours to change
    _add_bias(x, chosen)
    _mask_min_tokens(x, chosen, eos_token_ids)
    _penalise(x, chosen)
    return x if every_row else logits.index_copy(0, index, x)


def _add_bias(x: torch.Tensor, seqs: list[EngineRequest]) -> None:
    entries = [(row, token, bias) for row, s in enumerate(seqs) for token, bias in s.params.logit_bias]
    if not entries:
        return
    rows, tokens, biases = zip(*entries, strict=True)
    values = torch.tensor(biases, dtype=x.dtype, device=x.device)
    # ids are unique per request: each entry is added once, as HF's `scores + bias` adds it
    x.index_put_((_index(rows, x.device), _index(tokens, x.device)), values, accumulate=True)


def _mask_min_tokens(x: torch.Tensor, seqs: list[EngineRequest], eos_token_ids: Collection[int]) -> None:
    entries = [(row, token) for row, s in enumerate(seqs) for token in min_tokens_masked(s, eos_token_ids)]
    if entries:
        rows, tokens = zip(*entries, strict=True)
        masked = torch.tensor(float("-inf"), dtype=x.dtype, device=x.device)
        x.index_put_((_index(rows, x.device), _index(tokens, x.device)), masked)


def _penalise(x: torch.Tensor, seqs: list[EngineRequest]) -> None:
    """The three penalties on the rows that have any; a row's neutral values (1, 0, 0) leave it
    bit-exact, so the rows share one pass."""
    rows = [row for row, s in enumerate(seqs) if _penalised(s.params)]
    if not rows:
        return
    params = [seqs[row].params for row in rows]
    every_row = len(rows) == x.shape[0]
    index = _index(rows, x.device)
    sub = x if every_row else x.index_select(0, index)  # [P, vocab]
    counts = _counts([seqs[row].output_token_ids for row in rows], sub)  # output tokens only
    if any(p.repetition_penalty != 1.0 for p in params):
        prompts = [
            seqs[row].prompt_token_ids if p.repetition_penalty != 1.0 else []
            for row, p in zip(rows, params, strict=True)
        ]
        seen = (counts > 0) | (_counts(prompts, sub) > 0)
        penalty = torch.tensor([[p.repetition_penalty] for p in params], dtype=x.dtype)
        penalised = torch.where(sub < 0, sub * penalty.to(x.device), _divide(sub, penalty))
        sub = torch.where(seen, penalised, sub)
    if any(p.frequency_penalty != 0.0 for p in params):
        sub = sub - _column([p.frequency_penalty for p in params], sub) * counts
    if any(p.presence_penalty != 0.0 for p in params):
        sub = sub - _column([p.presence_penalty for p in params], sub) * (counts > 0)
    if every_row:
        x.copy_(sub)
    else:
        x.index_copy_(0, index, sub)


def _divide(x: torch.Tensor, divisor: torch.Tensor) -> torch.Tensor:
    """x / divisor [P, 1] (on the CPU), as HF's `scores / penalty` computes it: CUDA divides a
    tensor by a Python float as a product with its float32 reciprocal, one ulp from the quotient at
    times, which would break greedy token-exactness with HF there."""
    if x.device.type == "cuda":
        return x * (1.0 / divisor).to(x.device)
    return x / divisor.to(x.device)


def _column(values: list[float], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=like.dtype, device=like.device)[:, None]


def _counts(token_lists: Sequence[Sequence[int]], like: torch.Tensor) -> torch.Tensor:
    """[len(token_lists), vocab] in like's dtype: how often each row's list holds each token id
    (exact: a float holds every count a context can reach)."""
    counts = torch.zeros((len(token_lists), like.shape[-1]), dtype=like.dtype, device=like.device)
    flat = list(chain.from_iterable(token_lists))
    if flat:
        lengths = torch.tensor([len(t) for t in token_lists])
        rows = torch.repeat_interleave(torch.arange(len(token_lists)), lengths).to(like.device)
        ones = torch.ones(len(flat), dtype=like.dtype, device=like.device)
        counts.index_put_((rows, _index(flat, like.device)), ones, accumulate=True)
    return counts


def _index(values: Sequence[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)
