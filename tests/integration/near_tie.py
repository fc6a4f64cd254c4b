"""HF greedy `generate` as the ground truth for long answers, where a near tie may go either way.

The engine's fp32 logits are HF's up to rounding, not bit for bit: its GEMMs sum in another order
(kvferry's GEMM or oneDNN by row count, batched decode rows, a redelivered job's streamed tokens
computed again as one prefill chunk). HF against itself differs as much: on the tiny random model
(logits of about 20) its top-2 gap from one prefill over prompt + answer departs from generate's
(decode) gap by 7.6e-6 at the median, 2.6e-4 at most over 14,400 positions; the engine's, on the
workers and in process, straight or resumed, by 8e-6 and 3.6e-4. But over 8 answers of 300 tokens
(test_drain.py) HF's top-2 gap falls under 1.5e-4 somewhere in about a third of runs, and there
either token is a correct greedy pick: a token-for-token check fails now and then, no defect behind.

So `check` accepts a difference only where it is such a near tie: our token's HF logit within
NEAR_TIE of HF's top one, at most MAX_TIES times in one answer; and from there it compares with HF
continued from our token (`generate` again, over the prefix we made). Anything else fails, naming
the position and HF's logits there. A wrong KV moves logits by far more than NEAR_TIE."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

NEAR_TIE = 1e-3  # logits: ~3x the largest rounding deviation measured, 1/600 of the median gap
MAX_TIES = 2  # per answer: even one is rare (estimated 1-2 drain runs in 100); many mean a defect


@dataclass(frozen=True, slots=True)
class Greedy:
    """HF's greedy continuation and the logits each of its tokens was picked from."""

    tokens: list[int]
    logits: torch.Tensor  # [len(tokens), vocab]

    def shortfall(self, i: int, token: int) -> float:
        """How far `token`'s logit at output position i is below the picked one's."""
        row = self.logits[i]
        return float(row[self.tokens[i]] - row[token])


def hf_greedy_logits(model: Any, prompt: Sequence[int], new_tokens: int) -> Greedy:
    ids = torch.tensor([list(prompt)])
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            do_sample=False,
            output_scores=True,  # greedy with no processors: the raw logits of each step
            return_dict_in_generate=True,
        )
    return Greedy(out.sequences[0, len(prompt) :].tolist(), torch.stack(out.scores)[:, 0])


def check(
    model: Any, prompt: Sequence[int], answer: Sequence[int], what: str = ""
) -> list[tuple[int, float]]:
    """Assert `answer` is HF's greedy continuation of `prompt` up to near ties; returns the near
    ties taken (position, HF's top-2 logit gap there), in order."""
    answer = list(answer)
    ties: list[tuple[int, float]] = []
    done = 0
    while done < len(answer):
        ref = hf_greedy_logits(model, [*prompt, *answer[:done]], len(answer) - done)
        at = next((i for i, (a, b) in enumerate(zip(ref.tokens, answer[done:], strict=True)) if a != b), None)
        if at is None:
            return ties
        pos, ours = done + at, answer[done + at]
        short = ref.shortfall(at, ours)
        if short > NEAR_TIE or len(ties) == MAX_TIES:
            raise AssertionError(
                f"{what}: the answer leaves HF greedy at output token {pos}: ours {ours}, HF's "
                f"{ref.tokens[at]}, whose logit is {short:.3g} above ours (near ties: {NEAR_TIE:g}; "
                f"taken before: {ties})"
            )
        ties.append((pos, short))
        done = pos + 1
    return ties
