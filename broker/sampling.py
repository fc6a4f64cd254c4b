"""Sampling parameters: the part of a generation request that crosses every boundary."""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.errors import InvalidRequestError


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick tokens. temperature 0 means greedy (token-exact with HF `generate`)."""

    max_tokens: int | None = 16
    temperature: float = 0.0
    top_k: int = 0  # 0 disables
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens is not None and (
            isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens <= 0
        ):
            raise InvalidRequestError(
                f"max_tokens must be a positive integer, got {self.max_tokens!r}", "max_tokens"
            )
        if not 0.0 <= self.temperature <= 100.0:
            raise InvalidRequestError(
                f"temperature must be in [0, 100], got {self.temperature}", "temperature"
            )
        if self.top_k < 0:
            raise InvalidRequestError(f"top_k must be >= 0, got {self.top_k}", "top_k")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}", "top_p")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequestError("stop must be non-empty strings", "stop")
        if len(self.stop) > 4:
            raise InvalidRequestError("at most 4 stop strings", "stop")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
