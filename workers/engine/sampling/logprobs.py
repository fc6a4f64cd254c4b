"""Log-probabilities under the model's raw logits (before temperature, penalties and masks, as
vLLM's default): of each sampled token for the requests that ask (params.logprobs), and of each
prompt token (params.prompt_logprobs). Computed in the batched step, for those rows only."""

from __future__ import annotations

from collections.abc import Callable

import torch

from workers.engine.requests.logprob import Logprob
from workers.engine.requests.sequence import EngineRequest

PROMPT_CHUNK_ROWS = 256  # prompt positions turned into [rows, vocab] logits at a time


def _entries(lp: torch.Tensor, chosen: list[int], k: int) -> list[Logprob]:
    """lp: [rows, vocab] log-softmax; chosen: a token per row; k: top alternatives per row."""
    picked = lp.gather(1, torch.tensor(chosen, device=lp.device)[:, None])[:, 0].tolist()
    if k <= 0:
        return [Logprob(t, v) for t, v in zip(chosen, picked, strict=True)]
    values, ids = lp.topk(k, dim=-1)
    return [
        Logprob(t, v, tuple(zip(i, w, strict=True)))
        for t, v, i, w in zip(chosen, picked, ids.tolist(), values.tolist(), strict=True)
    ]


def sampled(
    logits: torch.Tensor, seqs: list[EngineRequest], tokens: list[int | Exception]
) -> list[Logprob | None]:
    """One entry per row: the sampled token's logprob and top alternatives, for the rows that ask."""
    out: list[Logprob | None] = [None] * len(seqs)
    rows = [
        i
        for i, (seq, token) in enumerate(zip(seqs, tokens, strict=True))
        if seq.params.logprobs is not None and isinstance(token, int)
    ]
    if not rows:
        return out
    lp = torch.log_softmax(logits[rows].float(), dim=-1)
    k = max(seqs[i].params.logprobs or 0 for i in rows)
    entries = _entries(lp, [tokens[i] for i in rows], k)  # type: ignore[misc]
    for i, entry in zip(rows, entries, strict=True):
        want = seqs[i].params.logprobs or 0
        out[i] = entry if len(entry.top) == want else Logprob(entry.token_id, entry.logprob, entry.top[:want])
    return out


def fill_prompt(
    seq: EngineRequest, position: int, hidden: torch.Tensor, to_logits: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    """seq's prompt logprobs for the tokens at position + 1 .. position + len(hidden), from the
    hidden states of positions position .. (each predicts the next). A recomputed range (after a
    preemption) replaces what was there."""
    k = seq.params.prompt_logprobs or 0
    targets = seq.prompt_token_ids[position + 1 : position + 1 + hidden.shape[0]]
    del seq.prompt_logprobs[position:]
    for at in range(0, len(targets), PROMPT_CHUNK_ROWS):
        lp = torch.log_softmax(to_logits(hidden[at : at + PROMPT_CHUNK_ROWS]), dim=-1)
        seq.prompt_logprobs.extend(_entries(lp, targets[at : at + PROMPT_CHUNK_ROWS], k))
