"""The usage of an answer several jobs made (a batch of prompts, n choices of each): a prompt's
tokens count once, however many choices it had (its first choice's job says where they came
from); every choice's completion tokens count, best_of candidates that were not returned too,
as OpenAI bills them."""

from __future__ import annotations

from collections.abc import Sequence

from broker.messages import Usage

_PROMPT_FIELDS = ("prompt_tokens", "cached_tokens", "pool_tokens", "warm_tokens", "redis_tokens")


def fan_in_usage(per_prompt: Sequence[Sequence[Usage]]) -> Usage:
    """per_prompt: each prompt's jobs' usages, its first choice's first."""
    totals = dict.fromkeys(Usage.__struct_fields__, 0)
    for usages in per_prompt:
        for name in _PROMPT_FIELDS:
            totals[name] += getattr(usages[0], name)
        for u in usages:
            totals["completion_tokens"] += u.completion_tokens
            totals["recomputed_tokens"] += u.recomputed_tokens
    return Usage(**totals)
