"""BatchBudget: how much batch work one step carries while interactive requests flow
(interactive_batch_step).

An interactive request that arrives mid-step waits for that step to end before its prefill runs
(alone: scheduler.py), so the batch work in the step in flight is added to its TTFT. While no
interactive request has been seen for INTERACTIVE_LINGER_S, batch sequences fill the step as
before. While they flow, a step's batch rows are held to (interactive_batch_step - 1) times the
predicted cost of the step without them (at least one decode row: what an interactive request
costs once it decodes), by the step cost model's row costs (step_cost.py): decode rows at the
fitted row cost, prompt rows at the prefill row cost, the oldest running batch sequences first. The
first batch sequence always goes in, so a batch always makes progress.

Interactive traffic counts as flowing when it flows on any worker of the fleet, not only this one
(`elsewhere_until`, set from workers/jobs/interactive_presence.py): the next interactive request
may be routed here, and it waits out the step in flight whichever worker served the last one.

A step costs a fixed part (the weights are read once per step) however few batch rows it carries,
so sizing alone leaves an arrival half such a step to wait on average. While traffic flows, a
step that carried batch rows and no interactive one is therefore followed by an idle gap
(`pause`): such steps take at most interactive_batch_duty of the time, and an arrival in the gap
starts at once (the engine loop waits on its inbox: workers/loop/engine_loop.py). The mean wait
for a step in flight falls from S / 2 to duty * S / 2; batch throughput falls to about duty's share
while interactive traffic flows, and is whole again one linger after it stops.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from workers.engine.requests.sequence import EngineRequest
from workers.engine.scheduling.step_cost import StepCost
from workers.engine.scheduling.step_plan import StepPlan

# An interactive request that ended a moment ago often has a successor (a client's next request,
# a session's next turn): the steps stay sized until the interactive side has been quiet this long.
INTERACTIVE_LINGER_S = 1.0


@dataclass(slots=True)
class BatchBudget:
    """The batch seconds one step may still take; None: no limit."""

    seconds: float | None
    decode_row_s: float = 0.0
    prefill_row_s: float = 0.0
    taken: int = 0  # batch sequences scheduled so far this step

    def fit(self, n: int, decode: bool) -> int:
        """Of a batch sequence's n tokens, those the step still takes (all while unlimited)."""
        if self.seconds is None or not self.taken:
            return n
        row = self.decode_row_s if decode else self.prefill_row_s
        if row <= 0:
            return n
        return max(0, min(n, int(self.seconds / row + 1e-9)))

    def take(self, n: int, decode: bool) -> None:
        self.taken += 1
        if self.seconds is not None:
            self.seconds -= n * (self.decode_row_s if decode else self.prefill_row_s)


class BatchSizer:
    def __init__(self, factor: float, duty: float = 1.0) -> None:
        self.factor = factor  # interactive_batch_step; 0: never sized
        self.duty = duty  # interactive_batch_duty; 1: no gap after batch-only steps
        self.last_interactive = float("-inf")  # when an interactive sequence last arrived or ended
        # Until when (the scheduler's clock) interactive traffic flows elsewhere in the fleet; a
        # float stored by another thread and read here at each step.
        self.elsewhere_until = float("-inf")

    def seen(self, seq: EngineRequest, now: float) -> None:
        """seq arrived or ended."""
        if not seq.is_batch:
            self.last_interactive = now

    def flows(self, seqs: Iterable[EngineRequest], now: float) -> bool:
        """Interactive traffic flows: here (`seqs`: the running and waiting ones, or a linger after
        the last one) or elsewhere in the fleet."""
        return (
            now - self.last_interactive < INTERACTIVE_LINGER_S
            or now < self.elsewhere_until
            or any(not s.is_batch for s in seqs)
        )

    def pause(self, batch_only_flowing: bool, step_s: float) -> float:
        """Seconds the loop leaves idle after a step of `step_s` that carried only batch rows while
        interactive traffic flowed (`batch_only_flowing`; else 0)."""
        if not batch_only_flowing or self.duty >= 1.0:
            return 0.0
        return step_s * (1.0 / self.duty - 1.0)

    def budget(
        self, plan: StepPlan, cost: StepCost, seqs: Iterable[EngineRequest], now: float
    ) -> BatchBudget:
        """The batch budget of the step planned so far (`seqs`: the running and waiting ones)."""
        if self.factor <= 0 or not self.flows(seqs, now) or cost.decode_row_s is None:
            return BatchBudget(None)
        alone = cost.predict_rows(max(plan.num_decodes, 1), plan.num_prefill)
        return BatchBudget((self.factor - 1.0) * alone, cost.decode_row_s, cost.prefill_row_s or 0.0)
