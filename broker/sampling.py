"""Sampling parameters: the part of a generation request that crosses every boundary."""

from __future__ import annotations

import math

import msgspec

from broker.errors import InvalidRequestError
from broker.penalty_params import check_penalties
from broker.structured import StructuredOutputs

# torch.Generator.manual_seed takes any integer that fits in 64 bits: [0, 2**64) here (it would
# also wrap negatives, but a seed is documented as unsigned so -1 does not alias 2**64 - 1).
SEED_MAX = 2**64 - 1  # inclusive
# Below this, logits / temperature overflows float32 and softmax yields NaN: the request would
# fail mid-step. Use 0 for greedy instead.
MIN_TEMPERATURE = 1e-2
MAX_TEMPERATURE = 100.0
MAX_STOP_STRINGS = 4
MAX_LOGPROBS = 20  # top alternatives per token, as OpenAI's top_logprobs (and vLLM's default cap)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class SamplingParams(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How to pick tokens. temperature 0 means greedy (token-exact with HF `generate`).

    temperature: 0, or in [MIN_TEMPERATURE, MAX_TEMPERATURE]. top_k: -1 or 0 disable it.
    top_p in (0, 1]. seed in [0, SEED_MAX]. Every float is finite. structured_outputs: a
    constraint the output follows (checked by its own rules). Violations raise
    InvalidRequestError whose `param` names the field, whether constructed or decoded (msgspec
    runs __post_init__ on both; broker/codec.py unwraps the error it wraps that in).
    """

    max_tokens: int | None = 16
    temperature: float = 0.0
    top_k: int = 0  # 0 (or -1) disables
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    # Log-probabilities of each output token with this many top alternatives (None: none), and
    # of each prompt token (None: none; the prompt's KV is then computed, never taken from a cache).
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    # vLLM's semantics, each off by default; bounded in broker/penalty_params.py.
    frequency_penalty: float = 0.0  # over output tokens: minus penalty * count
    presence_penalty: float = 0.0  # over output tokens: minus penalty once seen
    repetition_penalty: float = 1.0  # over prompt and output tokens seen (HF's); 1 disables it
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)
    min_p: float = 0.0  # drop tokens less likely than min_p times the top one, after temperature
    min_tokens: int = 0  # EOS and stop_token_ids held back (and no stop) until this many are out
    stop_token_ids: tuple[int, ...] = ()  # end with "stop", the token included in the output
    # a grammar the output must follow (JSON schema, regex, choice...): broker/structured.py
    structured_outputs: StructuredOutputs | None = None

    def __post_init__(self) -> None:
        # 0 only computes the prompt, for its logprobs (echo): the engine samples nothing then
        least = 0 if self.prompt_logprobs is not None else 1
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < least):
            raise InvalidRequestError(
                f"max_tokens must be an integer >= {least} (0 only with prompt logprobs), "
                f"got {self.max_tokens!r}",
                "max_tokens",
            )
        t = self.temperature
        if not _is_number(t) or not math.isfinite(t):
            raise InvalidRequestError(f"temperature must be a finite number, got {t!r}", "temperature")
        if t != 0 and not MIN_TEMPERATURE <= t <= MAX_TEMPERATURE:
            raise InvalidRequestError(
                f"temperature must be 0 (greedy) or in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}], got {t!r}",
                "temperature",
            )
        if not _is_int(self.top_k) or self.top_k < -1:
            raise InvalidRequestError(
                f"top_k must be an integer >= -1 (-1 or 0 disable it), got {self.top_k!r}", "top_k"
            )
        p = self.top_p
        if not _is_number(p) or not math.isfinite(p) or not 0.0 < p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {p!r}", "top_p")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed <= SEED_MAX):
            raise InvalidRequestError(f"seed must be an integer in [0, 2**64 - 1], got {self.seed!r}", "seed")
        if not isinstance(self.stop, tuple) or any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequestError("stop must be non-empty strings", "stop")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequestError(f"at most {MAX_STOP_STRINGS} stop strings", "stop")
        if not isinstance(self.ignore_eos, bool):
            raise InvalidRequestError("ignore_eos must be a boolean", "ignore_eos")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and (not _is_int(k) or not 0 <= k <= MAX_LOGPROBS):
                raise InvalidRequestError(
                    f"{name} must be an integer in [0, {MAX_LOGPROBS}], got {k!r}", name
                )
        check_penalties(self)
        so = self.structured_outputs
        if so is not None and not isinstance(so, StructuredOutputs):
            raise InvalidRequestError("structured_outputs must be a StructuredOutputs", "structured_outputs")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def check(self) -> None:
        """Re-run the validation (for instances that may have bypassed the constructor)."""
        self.__post_init__()
