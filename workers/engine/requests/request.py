"""GenerationRequest: what one generation asks of the engine, built once where the job starts
(workers/jobs/attempt.py) and carried unchanged to the engine loop, its Submit message, the
engine (LLMEngine.add_request) or the simulated engine. A new field is added here alone."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from broker.priority import JobClass
from broker.sampling import SamplingParams

if TYPE_CHECKING:
    from workers.engine.grammar.matcher import CompiledGrammar


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    request_id: str
    prompt_token_ids: Sequence[int]
    params: SamplingParams
    cache_salt: str = ""
    # A request another process had started (a redelivered job): its output tokens so far, and
    # how many characters of their text the client has already been sent.
    output_token_ids: Sequence[int] = ()
    streamed_chars: int = 0
    # A session turn: the pool keeps its partial last block for the next turn (KeptTails).
    keep_tail: bool = False
    # params.structured_outputs, compiled by the sender (else the engine's thread compiles it).
    grammar: CompiledGrammar | None = None
    # Its place in the engine's waiting order (workers/engine/scheduling/wait_queue.py).
    job_class: JobClass = "interactive"
    priority: int = 0
    # The caller calls handle.first_out() once its first token is out (the loop waits for that
    # before its next step: workers/loop/handle.py).
    reports_first_out: bool = False

    def __post_init__(self) -> None:  # frozen all the way down: the token lists become tuples
        object.__setattr__(self, "prompt_token_ids", tuple(self.prompt_token_ids))
        object.__setattr__(self, "output_token_ids", tuple(self.output_token_ids))

    @classmethod
    def new(
        cls,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        request_id: str | None = None,
        **fields: Any,
    ) -> GenerationRequest:
        """A request with a fresh id unless one is given."""
        return cls(request_id or f"req-{uuid.uuid4().hex[:16]}", prompt_token_ids, params, **fields)

    @property
    def is_batch(self) -> bool:
        return self.job_class == "batch"
