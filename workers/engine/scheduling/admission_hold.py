"""AdmissionHold: whether waiting interactive prompts stay out of this step (prefill_batch_hold).

A step that carries a new prompt's prefill costs every running request a slower step, and the
prefill work is the same whenever it runs, so capping it per step only spreads it over more steps.
What shrinks it is fewer steps with prefill in a request's life: while others decode, new
interactive prompts wait and are then prefilled together. Requests admitted together finish
together (and at a fixed output length, their successors arrive together), so the cohorts merge,
and the decode steps between cohorts carry no prefill.

The bound comes from the step cost model (step_cost.py: t(p) = a decode step + c * p prefill rows,
timed from this engine's steps on the CPU at hand). Each waiting prompt counts the rows its
admission would compute: its tokens less those its cached prefix covers (pool hits; warm-tier
blocks, including those prefetched from Redis, which are copied into the pool, not computed) and
those a kept tail or a running sequence's partial block gives it. So a returning session turn whose
history is cached is judged by its new tokens, not as a cold prompt of its length. With P the
waiting prompts' rows, n of them and B sequences once they join the running ones: hold while the
oldest's predicted TTFT, its wait + t(0) (held one more decode step) + t(P) (the step prefilling
them all), stays under prefill_batch_hold * t(P * B / n), the prefill of a full batch of prompts
like them (each computing their mean number of rows), so a cohort can wait for the running one to
finish and merge with it. A prompt that computes few rows adds little to the step that takes it:
its bound is about one step, so it goes in at once or soon. No hold while nothing decodes (nothing
to spare), while a running prefill continues this step (joining it costs no extra step), for a
preempted sequence, when the seats are full, or before both kinds of step have been timed.

Its own module (not scheduler.py) so the scheduler stays about queues and room. The lookups it
makes change nothing: the pool's match reads its index only, the warm tier is peeked (no LRU
refresh, no hit or miss counted, nothing removed), kept tails and running sequences are looked at,
not taken, and no prefix query is recorded. They run once per waiting interactive sequence per step
(blocks a prefetch brings, or a neighbour commits, count from the next step on), and only when
every other condition for a hold is met; a sequence's block hashes are memoised on it
(BlockManager.prefix_hashes), so a held prompt is hashed once, not at every step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from workers.engine.block_manager import BlockManager
from workers.engine.config import EngineConfig
from workers.engine.requests.sequence import EngineRequest
from workers.engine.scheduling.step_cost import StepCost
from workers.engine.scheduling.step_plan import StepPlan
from workers.engine.tiers.bridge import TierBridge


class AdmissionHold:
    def __init__(self, config: EngineConfig, blocks: BlockManager, tiers: TierBridge | None) -> None:
        self.factor = config.prefill_batch_hold
        self.max_num_seqs = config.max_num_seqs
        self.blocks = blocks
        self.tiers = tiers
        self._arrived: dict[int, float] = {}  # id(seq) -> when it was added, while it waits

    def arrive(self, seq: EngineRequest, now: float) -> None:
        self._arrived[id(seq)] = now

    def leave(self, seq: EngineRequest) -> None:
        """seq no longer waits (admitted, finished or aborted)."""
        self._arrived.pop(id(seq), None)

    def oldest_wait(self, now: float) -> float:
        """How long the sequence waiting longest without having started has waited (0: none)."""
        return now - min(self._arrived.values(), default=now)

    def holds(
        self,
        plan: StepPlan,
        waiting: Iterable[EngineRequest],
        running: Sequence[EngineRequest],
        cost: StepCost,
        clock: Callable[[], float],
    ) -> bool:
        """Whether the waiting interactive sequences stay out of this step (module docstring)."""
        if self.factor <= 0 or not plan.num_decodes or plan.num_prefill or not cost.ready:
            return False
        seqs = [s for s in waiting if not s.is_batch]
        if not seqs or any(s.num_preemptions for s in seqs):
            return False
        batch = len(running) + len(seqs)
        if batch >= self.max_num_seqs:
            return False
        now = clock()
        waited = now - min(self._arrived.get(id(s), now) for s in seqs)
        prefill = sum(self.uncached_tokens(s, running) for s in seqs)  # P: the rows they compute
        ttft = waited + cost.predict(0) + cost.predict(prefill)  # held one more step, then prefilled
        # A full batch (the running and the waiting) of prompts computing the waiting ones' mean rows.
        return ttft < self.factor * cost.predict(prefill * batch // len(seqs))

    def uncached_tokens(self, seq: EngineRequest, running: Sequence[EngineRequest] = ()) -> int:
        """The tokens seq's admission would compute now: all but those its cached prefix covers
        in the pool and the warm tier, and those a kept tail or a running sequence's partial
        block (a copy) gives it; never the last (its logits pick the next token). Reads only:
        no reference, LRU order, warm-tier entry, kept tail or statistic changes."""
        bs = self.blocks.block_size
        hits, hashes = self.blocks.match_prefix(seq)
        known = len(hits)
        if self.tiers is not None and hashes and not seq.needs_prompt_logits:
            known += self.tiers.peek_run(hashes[known:], seq.token_slice(0, len(hashes) * bs), known)
        return seq.num_tokens - known * bs - self.blocks.reused_tokens(seq, hashes, known, running)
