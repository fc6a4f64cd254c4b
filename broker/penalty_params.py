"""The SamplingParams fields that reshape a row's logits before a draw (penalties, logit_bias,
min_p) or decide when it may end (min_tokens, stop_token_ids): their bounds and their checks.
Semantics are vLLM's; ranges OpenAI's where it defines one."""

from __future__ import annotations

import math
from typing import Protocol

from broker.errors import InvalidRequestError

PENALTY_MAX = 2.0  # frequency_penalty and presence_penalty: [-2, 2], as OpenAI's
# vLLM takes any positive repetition_penalty; past this bound every token seen is as good as
# banned already, so a larger value is more likely a mistake than a wish.
MAX_REPETITION_PENALTY = 10.0
LOGIT_BIAS_MAX = 100.0  # a bias in [-100, 100], as OpenAI's
MAX_LOGIT_BIAS = 300  # entries; OpenAI documents no count, this bounds the work a request adds
MAX_STOP_TOKEN_IDS = 64


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _in_range(value: object, low: float, high: float) -> bool:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    return math.isfinite(value) and low <= value <= high


class PenaltyFields(Protocol):
    """The fields of SamplingParams this module checks (a protocol: sampling.py imports us)."""

    @property
    def max_tokens(self) -> int | None: ...
    @property
    def frequency_penalty(self) -> float: ...
    @property
    def presence_penalty(self) -> float: ...
    @property
    def repetition_penalty(self) -> float: ...
    @property
    def logit_bias(self) -> tuple[tuple[int, float], ...]: ...
    @property
    def min_p(self) -> float: ...
    @property
    def min_tokens(self) -> int: ...
    @property
    def stop_token_ids(self) -> tuple[int, ...]: ...


def check_penalties(p: PenaltyFields) -> None:
    """Raise InvalidRequestError naming the first bad field among those this module owns."""
    for name in ("frequency_penalty", "presence_penalty"):
        if not _in_range(getattr(p, name), -PENALTY_MAX, PENALTY_MAX):
            raise InvalidRequestError(f"{name} must be in [-2, 2], got {getattr(p, name)!r}", name)
    r = p.repetition_penalty
    if not _in_range(r, 0.0, MAX_REPETITION_PENALTY) or r == 0:
        raise InvalidRequestError(
            f"repetition_penalty must be in (0, {MAX_REPETITION_PENALTY:g}] (1 disables it), got {r!r}",
            "repetition_penalty",
        )
    if not _in_range(p.min_p, 0.0, 1.0):
        raise InvalidRequestError(f"min_p must be in [0, 1], got {p.min_p!r}", "min_p")
    _check_logit_bias(p.logit_bias)
    if not _is_int(p.min_tokens) or p.min_tokens < 0:
        raise InvalidRequestError(
            f"min_tokens must be a non-negative integer, got {p.min_tokens!r}", "min_tokens"
        )
    if p.max_tokens is not None and p.min_tokens > p.max_tokens:
        raise InvalidRequestError(
            f"min_tokens ({p.min_tokens}) must be at most max_tokens ({p.max_tokens})", "min_tokens"
        )
    ids = p.stop_token_ids
    if not isinstance(ids, tuple) or any(not _is_int(t) or t < 0 for t in ids):
        raise InvalidRequestError("stop_token_ids must be non-negative integers", "stop_token_ids")
    if len(ids) > MAX_STOP_TOKEN_IDS:
        raise InvalidRequestError(f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids", "stop_token_ids")


def _check_logit_bias(pairs: object) -> None:
    if not isinstance(pairs, tuple) or any(
        not isinstance(pair, tuple) or len(pair) != 2 or not _is_int(pair[0]) or pair[0] < 0 for pair in pairs
    ):
        raise InvalidRequestError("logit_bias must be (token id, bias) pairs", "logit_bias")
    if len(pairs) > MAX_LOGIT_BIAS:
        raise InvalidRequestError(f"logit_bias may name at most {MAX_LOGIT_BIAS} tokens", "logit_bias")
    if any(not _in_range(bias, -LOGIT_BIAS_MAX, LOGIT_BIAS_MAX) for _, bias in pairs):
        raise InvalidRequestError("logit_bias values must be numbers in [-100, 100]", "logit_bias")
    if len({token for token, _ in pairs}) != len(pairs):
        raise InvalidRequestError("logit_bias names a token id twice", "logit_bias")
