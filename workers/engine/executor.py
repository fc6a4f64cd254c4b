"""Executor: the run part of a step. Tier loads and copies into the pool, the forward, sampling:
one token (or its request's error) per sampling sequence, with its logprob where asked."""

from __future__ import annotations

from dataclasses import dataclass

from kvstore.pool.kv_cache import KVCache
from workers.engine.model_runner import ModelRunner
from workers.engine.requests.logprob import Logprob
from workers.engine.sampling import logprobs
from workers.engine.sampling.sampler import Sampler
from workers.engine.scheduling.scheduler import SchedulerOutput


@dataclass(frozen=True, slots=True)
class Sampled:
    tokens: list[int | Exception]  # per sampling sequence of the step, in its order
    logprobs: list[Logprob | None]


class Executor:
    def __init__(self, kv_cache: KVCache, runner: ModelRunner, sampler: Sampler) -> None:
        self.kv_cache = kv_cache
        self.runner = runner
        self.sampler = sampler

    def run(self, step: SchedulerOutput) -> Sampled:
        """Prompt logprobs go to their sequences; sampled tokens come back."""
        if step.loads:
            self.kv_cache.write_blocks([(load.block_id, load.stored.kv) for load in step.loads])
        for copy in step.copies:
            self.kv_cache.copy_block(copy.src, copy.dst)
        out = self.runner.run(list(step.scheduled))
        if out.prompt:
            for item in step.scheduled:
                got = out.prompt.get(id(item.seq))
                if got is not None:
                    logprobs.fill_prompt(item.seq, got[0], got[1], self.runner.logits)
        seqs = [s.seq for s in step.scheduled if s.samples]
        if not seqs:
            return Sampled([], [])
        tokens = self.sampler.sample_isolated(out.sample, seqs)
        return Sampled(tokens, logprobs.sampled(out.sample, seqs, tokens))
