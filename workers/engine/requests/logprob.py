"""Logprob: a token's log-probability inside the engine (ids only; the job's task thread adds
each token's text before it leaves the worker)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Logprob:
    token_id: int
    logprob: float | None  # None: a prompt's first token, which nothing predicts
    top: tuple[tuple[int, float], ...] = ()  # the likeliest alternatives, most likely first
