"""StepCounters: what the engine's steps have done so far (batch sizes, tokens computed)."""

from __future__ import annotations

from dataclasses import dataclass

from workers.engine.scheduling.scheduler import SchedulerOutput


@dataclass(slots=True)
class StepCounters:
    num_steps: int = 0
    max_batch_seqs: int = 0
    max_batch_tokens: int = 0
    prompt_tokens_computed: int = 0

    def account(self, step: SchedulerOutput) -> None:
        """Count a scheduled step; before it runs (it reads each sequence's progress so far)."""
        self.num_steps += 1
        self.max_batch_seqs = max(self.max_batch_seqs, len(step.scheduled))
        self.max_batch_tokens = max(self.max_batch_tokens, step.num_tokens)
        for s in step.scheduled:
            start = s.seq.num_computed_tokens
            self.prompt_tokens_computed += max(
                0, min(start + s.num_new_tokens, s.seq.num_prompt_tokens) - start
            )
