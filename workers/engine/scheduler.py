"""Scheduler: waiting and running queues, admission by pool capacity, preemption by recompute."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from kvstore.block_hash import BlockHash
from workers.engine.block_manager import BlockManager
from workers.engine.config import EngineConfig
from workers.engine.kv_tiers import TierCache
from workers.engine.sequence import Sequence, SequenceStatus


@dataclass(frozen=True, slots=True)
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int

    @property
    def samples(self) -> bool:
        """True when this step reaches the end of the known tokens, so its logits pick a token."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


class Scheduler:
    def __init__(
        self, config: EngineConfig, block_manager: BlockManager, tiers: TierCache | None = None
    ) -> None:
        self.config = config
        self.blocks = block_manager
        self.tiers = tiers
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.outgrown: list[Sequence] = []  # sequences that alone outgrow the whole pool

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[ScheduledSeq]:
        budget = self.config.max_num_batched_tokens
        scheduled: list[ScheduledSeq] = []
        preempted = False

        # Running sequences first (decodes and unfinished prefill chunks), oldest first.
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_uncomputed_tokens, budget)
            while not self.blocks.can_append(seq, n):
                victim = self.running.pop()  # the newest arrival gives way
                if victim is seq and not self.running:
                    self._outgrow(seq)  # nothing else holds blocks: seq alone outgrew the pool
                    break
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                self.blocks.append(seq, n)
                scheduled.append(ScheduledSeq(seq, n))
                budget -= n
                i += 1
                continue
            break

        # Then new arrivals, unless this step had to preempt (no room to spare).
        if preempted:
            return scheduled
        pending = self._pending_prefix_hashes()
        deferred: list[Sequence] = []
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            hits, hashes = self.blocks.match_prefix(seq)
            loaded = self.tiers.lookup(hashes[len(hits) :], seq.token_ids, len(hits)) if self.tiers else []
            known = len(hits) + len(loaded)
            if len(hashes) > known and hashes[known] in pending:
                # Its next block is being computed right now by another prefill: wait a step and
                # share it, instead of computing the same prefix twice in parallel.
                deferred.append(self.waiting.popleft())
                continue
            bs = self.blocks.block_size
            n = min(seq.num_tokens - known * bs, budget)
            if not self.blocks.allocate(seq, hits, hashes, n, loaded):
                break
            n = min(seq.num_uncomputed_tokens, budget)  # less when it took a kept partial block
            if seq.num_cached_tokens < 0:  # first admission: count the prefix query once
                seq.num_cached_tokens = seq.num_computed_tokens - len(loaded) * bs
                seq.num_warm_tokens = len(loaded) * bs
                if self.tiers is not None:
                    seq.num_redis_tokens = bs * sum(
                        1 for b in loaded if b.block_hash in self.tiers.from_redis
                    )
                self.blocks.pool.record_prefix_query(seq.num_prompt_tokens, seq.num_cached_tokens)
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            seq.prefix_hashes = hashes
            self.running.append(seq)
            scheduled.append(ScheduledSeq(seq, n))
            budget -= n
            pending.update(hashes[known:])
        self.waiting.extendleft(reversed(deferred))
        return scheduled

    def _pending_prefix_hashes(self) -> set[BlockHash]:
        """Hashes of prompt blocks that running prefills will commit but have not yet."""
        pending: set[BlockHash] = set()
        for seq in self.running:
            if seq.num_computed_tokens < seq.num_prompt_tokens:
                pending.update(seq.prefix_hashes[len(seq.block_hashes) :])
        return pending

    def _preempt(self, seq: Sequence) -> None:
        self.blocks.free(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _outgrow(self, seq: Sequence) -> None:
        self.blocks.free(seq)
        seq.num_computed_tokens = 0
        self.outgrown.append(seq)

    def finish(self, seq: Sequence) -> None:
        """Release a finished (or aborted) sequence's blocks; they stay cached if hashed."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.free(seq)
        seq.status = SequenceStatus.FINISHED
