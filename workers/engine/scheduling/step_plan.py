"""What one engine step does (SchedulerOutput), and the plan the scheduler fills to decide it."""

from __future__ import annotations

from dataclasses import dataclass, field

from workers.engine.block_manager import BlockCopy, BlockLoad
from workers.engine.requests.sequence import EngineRequest


@dataclass(frozen=True, slots=True)
class ScheduledSeq:
    seq: EngineRequest
    num_new_tokens: int

    @property
    def samples(self) -> bool:
        """True when this step reaches the end of the known tokens, so its logits pick a token."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    """Everything one step must do, as decided by Scheduler.schedule()."""

    scheduled: tuple[ScheduledSeq, ...]  # decodes first, then prefill chunks
    loads: tuple[BlockLoad, ...]  # tier bytes to write into the pool before the forward
    outgrown: tuple[EngineRequest, ...]  # alone they outgrow the whole pool: they end ("length")
    preempted: tuple[EngineRequest, ...]  # sent back to waiting, their blocks freed (recompute)
    num_decodes: int  # scheduled sequences that compute one generated token
    num_prefill_tokens: int  # tokens of the others: prompt chunks, recomputes after preemption
    copies: tuple[BlockCopy, ...] = ()  # partial blocks forked into new sequences' blocks

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


def is_decoding(seq: EngineRequest) -> bool:
    """Its whole prompt is in the pool and one token is left to compute: the last one sampled."""
    return seq.num_uncomputed_tokens == 1 and seq.num_computed_tokens >= seq.num_prompt_tokens


@dataclass(slots=True)
class StepPlan:
    """A step being decided: what is scheduled so far and the token budget left."""

    budget: int
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    loads: list[BlockLoad] = field(default_factory=list)
    outgrown: list[EngineRequest] = field(default_factory=list)
    preempted: list[EngineRequest] = field(default_factory=list)  # for room: the step ends early
    yielded: list[EngineRequest] = field(default_factory=list)  # batch ones, for an interactive
    copies: list[BlockCopy] = field(default_factory=list)
    num_decodes: int = 0
    num_prefill: int = 0
    interactive_prefill: bool = False  # an interactive sequence computes prompt tokens this step

    def take(self, seq: EngineRequest, n: int, decode: bool) -> None:
        self.scheduled.append(ScheduledSeq(seq, n))
        self.num_decodes += decode
        self.num_prefill += 0 if decode else n
        self.budget -= n
        if not decode and not seq.is_batch:
            self.interactive_prefill = True

    def output(self) -> SchedulerOutput:
        return SchedulerOutput(
            tuple(self.scheduled),
            tuple(self.loads),
            tuple(self.outgrown),
            (*self.preempted, *self.yielded),
            self.num_decodes,
            self.num_prefill,
            tuple(self.copies),
        )
