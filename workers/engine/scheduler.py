"""Scheduler: waiting and running queues, admission by pool capacity, preemption by recompute."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from kvstore.chain import BlockHash
from kvstore.tiers.stored_block import StoredBlock
from workers.engine.block_manager import BlockCopy, BlockLoad, BlockManager
from workers.engine.config import EngineConfig
from workers.engine.requests.sequence import EngineRequest, RequestStatus
from workers.engine.tier_bridge import TierBridge


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


class Scheduler:
    def __init__(
        self, config: EngineConfig, block_manager: BlockManager, tiers: TierBridge | None = None
    ) -> None:
        self.config = config
        self.blocks = block_manager
        self.tiers = tiers
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.num_preemptions = 0

    def add(self, seq: EngineRequest) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledSeq] = []
        loads: list[BlockLoad] = []
        outgrown: list[EngineRequest] = []
        preempted: list[EngineRequest] = []
        copies: list[BlockCopy] = []
        num_decodes = num_prefill = 0

        def out() -> SchedulerOutput:
            return SchedulerOutput(
                tuple(scheduled),
                tuple(loads),
                tuple(outgrown),
                tuple(preempted),
                num_decodes,
                num_prefill,
                tuple(copies),
            )

        # Running sequences first: decodes, then unfinished prefill chunks; each oldest first.
        for seq in sorted(self.running, key=lambda s: not is_decoding(s)):
            if budget <= 0:
                break
            if seq.status is not RequestStatus.RUNNING:
                continue  # preempted by one scheduled before it
            decode = is_decoding(seq)
            room = budget if decode else self._prefill_room(budget, num_decodes, num_prefill)
            n = min(seq.num_uncomputed_tokens, room)
            if n <= 0:
                break  # the prefill cap is spent, and only prefills follow
            if not self._make_room(seq, n, scheduled, preempted, outgrown):
                break
            self.blocks.append(seq, n)
            scheduled.append(ScheduledSeq(seq, n))
            num_decodes += decode
            num_prefill += 0 if decode else n
            budget -= n

        # Then new arrivals, unless this step had to preempt (no room to spare).
        if preempted:
            return out()
        pending = self._pending_prefix_hashes()
        deferred: list[EngineRequest] = []
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            room = self._prefill_room(budget, num_decodes, num_prefill)
            if room <= 0:
                break
            seq = self.waiting[0]
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
            new_loads = self.blocks.allocate(seq, hits, hashes, n, loaded, self.running, copies)
            if new_loads is None:
                break
            loads.extend(new_loads)
            n = min(seq.num_uncomputed_tokens, room)  # less when it took a kept partial block
            if seq.num_cached_tokens < 0:  # first admission: count the prefix query once
                self._count_sources(seq, loaded)
            self.waiting.popleft()
            seq.status = RequestStatus.RUNNING
            seq.prefix_hashes = hashes
            self.running.append(seq)
            scheduled.append(ScheduledSeq(seq, n))
            num_prefill += n
            budget -= n
            pending.update(hashes[known:])
        self.waiting.extendleft(reversed(deferred))
        return out()

    def _prefill_room(self, budget: int, num_decodes: int, num_prefill: int) -> int:
        """Prefill tokens this step may still take: a step carrying decodes takes at most
        max_prefill_tokens_with_decodes of them, so a long prompt does not stretch every decode."""
        cap = self.config.max_prefill_tokens_with_decodes
        if cap is None or not num_decodes:
            return budget
        return min(budget, cap - num_prefill)

    def _make_room(
        self,
        seq: EngineRequest,
        n: int,
        scheduled: list[ScheduledSeq],
        preempted: list[EngineRequest],
        outgrown: list[EngineRequest],
    ) -> bool:
        """Preempt the newest running sequences not scheduled yet until seq's n tokens fit; False
        when seq itself had to go (preempted, or outgrown when nothing else holds blocks)."""
        taken = {id(s.seq) for s in scheduled}
        while not self.blocks.can_append(seq, n):
            victim = next(s for s in reversed(self.running) if id(s) not in taken)
            self.running.remove(victim)
            if victim is seq and not self.running:
                self.blocks.free(seq)  # nothing else holds blocks: seq alone outgrew the pool
                seq.num_computed_tokens = 0
                outgrown.append(seq)
                return False
            self._preempt(victim)
            preempted.append(victim)
            if victim is seq:
                return False
        return True

    def _count_sources(self, seq: EngineRequest, loaded: list[StoredBlock]) -> None:
        bs = self.blocks.block_size
        brought = self.tiers.from_redis if self.tiers is not None else set()
        from_redis = sum(1 for b in loaded if b.block_hash in brought)
        seq.num_cached_tokens = seq.num_computed_tokens - len(loaded) * bs
        seq.num_warm_tokens = (len(loaded) - from_redis) * bs
        seq.num_redis_tokens = from_redis * bs
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
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, seq: EngineRequest) -> None:
        """Release a finished (or aborted) sequence's blocks; they stay cached if hashed."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.free(seq)
        seq.status = RequestStatus.FINISHED
