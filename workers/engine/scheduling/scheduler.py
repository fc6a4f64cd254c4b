"""Scheduler: waiting and running queues, admission by pool capacity, preemption by recompute,
interactive sequences before batch ones (broker/priority.py).

A step is planned in up to three phases. (1) The running interactive sequences: decodes, then
unfinished prefill chunks. (2) Waiting interactive sequences are admitted, in the waiting order
(workers/engine/scheduling/wait_queue.py); one that finds no seat (max_num_seqs) or no room in the pool
takes them from the newest running batch sequence, which goes back to waiting (preemption by
recompute: token-exact). (3) Unless an interactive sequence computes prompt tokens this step,
the running batch sequences, then new batch sequences, only while no interactive one waits. So
a batch line never starts while an interactive request waits, and a step that prefills an
interactive prompt carries no batch work (batch decodes wait that step out). With no batch
sequence, phases 1 and 2 are the whole step: running first, then arrivals, as before classes.

Batch sizing (interactive_batch_step, workers/engine/scheduling/batch_budget.py): while interactive requests
flow, phase 3 takes batch rows only up to a predicted share of the step, so an interactive request
arriving mid-step waits for a short step, not a full batch one.

Admission hold (prefill_batch_hold, workers/engine/scheduling/admission_hold.py): while others decode, new
interactive prompts may wait a few steps to be prefilled together, judged by the prompt tokens
they will compute (their cached prefixes left out) and the step cost model.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from kvstore.chain import BlockHash
from kvstore.tiers.stored_block import StoredBlock
from workers.engine.block_manager import BlockManager
from workers.engine.config import EngineConfig
from workers.engine.requests.sequence import EngineRequest, RequestStatus
from workers.engine.scheduling.admission_hold import AdmissionHold
from workers.engine.scheduling.batch_budget import BatchBudget, BatchSizer
from workers.engine.scheduling.step_cost import StepCost
from workers.engine.scheduling.step_plan import ScheduledSeq, SchedulerOutput, StepPlan, is_decoding
from workers.engine.scheduling.wait_queue import WaitQueue
from workers.engine.tiers.bridge import TierBridge

__all__ = ["ScheduledSeq", "Scheduler", "SchedulerOutput", "is_decoding"]


class Scheduler:
    def __init__(
        self, config: EngineConfig, block_manager: BlockManager, tiers: TierBridge | None = None
    ) -> None:
        self.config = config
        self.blocks = block_manager
        self.tiers = tiers
        self.waiting = WaitQueue()
        self.running: list[EngineRequest] = []
        self.num_preemptions = 0
        self.cost = StepCost()  # the engine times each step into it
        self.clock: Callable[[], float] = time.monotonic
        self.hold = AdmissionHold(config, block_manager, tiers)
        self.num_held_steps = 0  # steps that held waiting prompts back (admission hold)
        self.sizer = BatchSizer(config.interactive_batch_step, config.interactive_batch_duty)
        # The last step carried batch rows alone while interactive traffic flowed (BatchSizer.pause).
        self.batch_only_flowing = False

    def add(self, seq: EngineRequest) -> None:
        self.hold.arrive(seq, self.clock())
        self.sizer.seen(seq, self.clock())
        self.waiting.add(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = self._schedule()
        batch_only = bool(out.scheduled) and all(s.seq.is_batch for s in out.scheduled)
        self.batch_only_flowing = batch_only and self.sizer.flows(
            [*self.running, *self.waiting], self.clock()
        )
        return out

    def _schedule(self) -> SchedulerOutput:
        plan = StepPlan(self.config.max_num_batched_tokens)
        # Running sequences first: decodes, then unfinished prefill chunks; each oldest first.
        ordered = sorted(self.running, key=lambda s: not is_decoding(s))
        if not self._run(plan, [s for s in ordered if not s.is_batch]):
            return plan.output()  # it had to preempt: no room to spare for arrivals
        pending = self._pending_prefix_hashes()
        if self.hold.holds(plan, self.waiting, self.running, self.cost, self.clock):
            self.num_held_steps += 1  # and no batch sequence is admitted while they wait
        else:
            self._admit(plan, pending, batch=False)
        if plan.interactive_prefill:
            return plan.output()
        budget = self.sizer.budget(plan, self.cost, [*self.running, *self.waiting], self.clock())
        if not self._run(plan, [s for s in ordered if s.is_batch], budget):
            return plan.output()
        if not self.waiting or self.waiting.first.is_batch:  # no interactive one waits
            self._admit(plan, pending, batch=True, budget=budget)
        return plan.output()

    def _run(self, plan: StepPlan, seqs: list[EngineRequest], budget: BatchBudget | None = None) -> bool:
        """Schedule running sequences (decodes first), batch ones within `budget`; False when one
        had to be preempted."""
        for seq in seqs:
            if plan.budget <= 0:
                break
            if seq.status is not RequestStatus.RUNNING:
                continue  # preempted by one scheduled before it
            decode = is_decoding(seq)
            room = plan.budget if decode else self._prefill_room(plan)
            n = min(seq.num_uncomputed_tokens, room)
            if budget is not None:
                n = budget.fit(n, decode)
            if n <= 0:
                break  # the prefill cap (or the batch budget) is spent
            if not self._make_room(seq, n, plan):
                break
            self.blocks.append(seq, n)
            plan.take(seq, n, decode)
            if budget is not None:
                budget.take(n, decode)
        return not plan.preempted

    def _admit(
        self, plan: StepPlan, pending: set[BlockHash], batch: bool, budget: BatchBudget | None = None
    ) -> None:
        """Admit waiting sequences of one class, first to last, while there is room (batch ones
        within `budget`); an interactive one makes room by preempting running batch sequences."""
        deferred: list[EngineRequest] = []
        while self.waiting and plan.budget > 0:
            seq = self.waiting.first
            if seq.is_batch != batch:
                break
            room = self._prefill_room(plan)
            if budget is not None:
                room = budget.fit(room, decode=False)
            if room <= 0:
                break
            if len(self.running) >= self.config.max_num_seqs:
                if batch or not self._yield_batch(plan):
                    break
                continue
            hits, hashes = self.blocks.match_prefix(seq)
            computes_all = seq.needs_prompt_logits  # no hit, no load, nothing to wait for
            loaded = (
                self.tiers.lookup(hashes[len(hits) :], seq.token_ids, len(hits))
                if self.tiers and not computes_all
                else []
            )
            known = len(hits) + len(loaded)
            if len(hashes) > known and hashes[known] in pending and not computes_all:
                # Its next block is being computed right now by another prefill: wait a step and
                # share it, instead of computing the same prefix twice in parallel.
                deferred.append(self.waiting.popleft())
                continue
            bs = self.blocks.block_size
            n = min(seq.num_tokens - known * bs, room)
            new_loads = self.blocks.allocate(seq, hits, hashes, n, loaded, self.running, plan.copies)
            if new_loads is None:
                if batch or not self._yield_batch(plan):
                    break
                continue  # matched again: the freed blocks may change what it finds
            plan.loads.extend(new_loads)
            n = min(seq.num_uncomputed_tokens, room)  # less when it took a kept partial block
            if seq.num_cached_tokens < 0:  # first admission: count the prefix query once
                self._count_sources(seq, loaded)
            self.waiting.popleft()
            self.hold.leave(seq)
            seq.status = RequestStatus.RUNNING
            seq.prefix_hashes = hashes
            self.running.append(seq)
            plan.take(seq, n, decode=False)
            if budget is not None:
                budget.take(n, decode=False)
            pending.update(hashes[known:])
        self.waiting.put_back_all(deferred)

    def _yield_batch(self, plan: StepPlan) -> bool:
        """Preempt the newest running batch sequence (none is scheduled yet when this runs), for
        a waiting interactive one; False when none runs."""
        victim = next((s for s in reversed(self.running) if s.is_batch), None)
        if victim is None:
            return False
        self.running.remove(victim)
        self._preempt(victim)
        plan.yielded.append(victim)
        return True

    def _prefill_room(self, plan: StepPlan) -> int:
        """Prefill tokens this step may still take: a step carrying decodes takes at most
        max_prefill_tokens_with_decodes of them, so a long prompt does not stretch every decode."""
        cap = self.config.max_prefill_tokens_with_decodes
        if cap is None or not plan.num_decodes:
            return plan.budget
        return min(plan.budget, cap - plan.num_prefill)

    def _make_room(self, seq: EngineRequest, n: int, plan: StepPlan) -> bool:
        """Preempt the newest running sequences not scheduled yet until seq's n tokens fit, batch
        ones first (a batch sequence takes room from batch ones only); False when seq itself had
        to go (preempted, or outgrown when nothing else holds blocks)."""
        taken = {id(s.seq) for s in plan.scheduled}
        while not self.blocks.can_append(seq, n):
            free = [s for s in reversed(self.running) if id(s) not in taken]
            victim = next((s for s in free if s.is_batch), seq if seq.is_batch else free[0])
            self.running.remove(victim)
            if victim is seq and not self.running:
                self.blocks.free(seq)  # nothing else holds blocks: seq alone outgrew the pool
                seq.num_computed_tokens = 0
                plan.outgrown.append(seq)
                return False
            self._preempt(victim)
            plan.preempted.append(victim)
            if victim is seq:
                return False
        return True

    def _count_sources(self, seq: EngineRequest, loaded: list[StoredBlock]) -> None:
        bs = self.blocks.block_size
        brought = self.tiers.from_redis if self.tiers is not None else set()
        from_redis = sum(1 for b in loaded if b.block_hash in brought)
        seq.num_cached_tokens = seq.num_computed_tokens - len(loaded) * bs - seq.num_tail_redis_tokens
        seq.num_warm_tokens = (len(loaded) - from_redis) * bs
        seq.num_redis_tokens = from_redis * bs + seq.num_tail_redis_tokens
        # A resumed request looks up its earlier output too, and may hit past its prompt.
        self.blocks.pool.record_prefix_query(seq.num_tokens, seq.num_cached_tokens)

    def _pending_prefix_hashes(self) -> set[BlockHash]:
        """Hashes of prompt blocks that running prefills will commit but have not yet."""
        pending: set[BlockHash] = set()
        for seq in self.running:
            if seq.num_computed_tokens < seq.num_prompt_tokens:
                pending.update(seq.prefix_hashes[len(seq.block_hashes) :])
        return pending

    def _preempt(self, seq: EngineRequest) -> None:
        self.blocks.free(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = RequestStatus.WAITING
        self.waiting.put_back(seq)
        self.num_preemptions += 1

    def finish(self, seq: EngineRequest) -> None:
        """Release a finished (or aborted) sequence's blocks; they stay cached if hashed."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.hold.leave(seq)
        self.sizer.seen(seq, self.clock())
        self.blocks.free(seq)
        seq.status = RequestStatus.FINISHED
