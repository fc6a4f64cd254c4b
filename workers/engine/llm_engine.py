"""LLMEngine: five parts wired by workers/engine/factory.py (build_engine). One step = schedule,
run, postprocess: the scheduler picks the batch, the executor runs it, the postprocessor turns the
sampled tokens into outputs; the tier bridge and the report watch from the side."""

from __future__ import annotations

import logging
import uuid

from broker.errors import InvalidRequestError
from broker.sampling import SamplingParams
from kvstore.pool.block_pool import BlockPool
from kvstore.tiers.stored_block import StoredBlock
from kvstore.tiers.tail import Tail
from workers.engine.config import EngineConfig
from workers.engine.errors import RequestFailedError
from workers.engine.executor import Executor, Sampled
from workers.engine.requests.intake import RequestLimits, new_sequence
from workers.engine.requests.logprob import Logprob
from workers.engine.requests.output import RequestOutput
from workers.engine.requests.request import GenerationRequest
from workers.engine.requests.sequence import EngineRequest, FinishReason, RequestStatus
from workers.engine.sampling.postprocess import Postprocessor
from workers.engine.scheduling.scheduler import Scheduler, SchedulerOutput
from workers.engine.served import ServedModel
from workers.engine.stats.report import EngineReport
from workers.engine.stats.snapshot import EngineStats
from workers.engine.tiers.bridge import TierBridge

log = logging.getLogger(__name__)


class LLMEngine:
    """Not thread-safe: one thread owns it (EngineLoop does, for concurrent callers)."""

    def __init__(
        self,
        config: EngineConfig,
        served: ServedModel,
        scheduler: Scheduler,
        executor: Executor,
        post: Postprocessor,
        tiers: TierBridge | None,
        report: EngineReport,
    ) -> None:
        self.config = config
        self.served = served  # what any thread may read: tokenizer, names, layout, grammars
        self.scheduler = scheduler  # schedule: which sequences run this step, and their blocks
        self.executor = executor  # run: tier loads, the forward, sampling
        self.post = post  # postprocess: stop rules, text, outputs
        self.tiers = tiers  # the warm and cold tiers, when blocks leaving the pool spill there
        self.report = report  # figures, step counters, fault hooks, integrity checks
        self.pool: BlockPool = scheduler.blocks.pool
        limits = (self.pool.block_size, self.pool.num_blocks, config.default_max_tokens)
        self.limits = RequestLimits(served.vocab_size, served.max_model_len, *limits)
        self._seqs: dict[str, EngineRequest] = {}
        self._ready: dict[str, RequestOutput] = {}  # resumed requests complete on arrival
        # Seconds the loop should leave idle before the next step (BatchSizer.pause), set by step().
        self.batch_pause_s = 0.0

    # -- requests ---------------------------------------------------------------------------

    def add_request(self, request: GenerationRequest) -> None:
        """Queue a request. Raises InvalidRequestError (nothing queued) when it cannot run. Its
        grammar is compiled here, on the engine's thread, when the sender did not."""
        rid = request.request_id
        if rid in self._seqs:
            raise InvalidRequestError(f"request id {rid!r} is already running", "request_id")
        seq = new_sequence(request, self.limits)
        if request.params.structured_outputs is not None:
            compiled = request.grammar or self.served.grammars.compile(request.params.structured_outputs)
            seq.grammar = compiled.matcher() if compiled is not None else None
        if request.output_token_ids:
            reason = self.post.resume(seq, request.output_token_ids, request.streamed_chars)
            if reason is not None:  # its worker died after the last token, before the result
                seq.finish_reason, seq.status = reason, RequestStatus.FINISHED
                self._ready[rid] = self.post.output(seq, [])
                return
        if request.keep_tail:
            self.scheduler.blocks.tails.want(rid)
        self._seqs[rid] = seq
        self.scheduler.add(seq)

    def admit_prefetched(
        self, blocks: list[StoredBlock], at_request: bool = True, tails: tuple[Tail, ...] = ()
    ) -> None:
        """Blocks a task thread fetched from Redis for a prompt: into the warm tier. at_request
        False: a warm start's, loaded before the worker took work (they count as warm, not Redis).
        `tails`: session turns' partial last blocks it fetched, kept here as if this worker had run
        those turns (kvstore/tiers/tail.py)."""
        if self.tiers is None:
            return
        if blocks:
            self.tiers.admit(blocks, at_request)
        for tail in tails:
            self.tiers.admit_tail(tail, self.scheduler.blocks.tails)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        if request_id in self._ready:
            return self._ready.pop(request_id)
        seq = self._seqs.get(request_id)
        return None if seq is None else self._finish(seq, "abort", [])

    def has_unfinished(self) -> bool:
        return bool(self._ready) or self.scheduler.has_unfinished()

    # -- the step -----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One batch. A request whose sampling or detokenising raises ends alone with
        finish_reason "error" (its typed error in the output's `cause`); anything else that raises
        is the engine's failure: the caller must then call abort_all() before stepping again."""
        clock = self.scheduler.cost.clock
        started = clock()
        self.batch_pause_s = 0.0
        step = self.scheduler.schedule()
        self.report.on_scheduled(step)
        outputs = [*self._ready.values(), *(self._finish(seq, "length", []) for seq in step.outgrown)]
        self._ready.clear()
        if not step.scheduled:
            return outputs
        done = self._postprocess(step, self.executor.run(step))
        seconds = clock() - started
        self.scheduler.cost.record(step.num_decodes, step.num_prefill_tokens, seconds)
        self.batch_pause_s = self.scheduler.sizer.pause(self.scheduler.batch_only_flowing, seconds)
        return [*outputs, *done]

    def _postprocess(self, step: SchedulerOutput, sampled: Sampled) -> list[RequestOutput]:
        sampling = [s for s in step.scheduled if s.samples]  # before the progress below moves on
        self.report.counters.account(step)
        for item in step.scheduled:
            prev = item.seq.num_computed_tokens
            item.seq.num_computed_tokens += item.num_new_tokens
            self.scheduler.blocks.commit(item.seq, prev)
        outputs = []
        for item, token, lp in zip(sampling, sampled.tokens, sampled.logprobs, strict=True):
            if isinstance(token, Exception):
                outputs.append(self._fail(item.seq, RequestFailedError.wrap(token, "sampling")))
            elif item.seq.max_tokens == 0:  # the prompt alone was asked for (echo): nothing sampled
                outputs.append(self._finish(item.seq, "length", []))
            else:
                try:
                    reason = self.post.append(item.seq, token)
                except InvalidRequestError as err:  # detokenising failed
                    outputs.append(self._fail(item.seq, err))
                    continue
                delta_lp = (lp,) if lp is not None else ()
                if reason is not None:
                    outputs.append(self._finish(item.seq, reason, [token], delta_lp))
                else:
                    outputs.append(self.post.output(item.seq, [token], delta_logprobs=delta_lp))
        return outputs

    def _finish(
        self, seq: EngineRequest, reason: FinishReason, delta: list[int], delta_lp: tuple[Logprob, ...] = ()
    ) -> RequestOutput:
        hashes = tuple(seq.block_hashes)  # before finish() frees the blocks and forgets them
        if self.tiers is not None and reason in ("stop", "length") and hashes:
            blocks = self.scheduler.blocks
            root, tail = blocks.root(seq.cache_salt), blocks.partial_tail(seq)
            self.tiers.persist(seq.block_ids, hashes, seq.token_ids, root, tail)
        self._release(seq, reason)
        return self.post.output(seq, delta, block_hashes=hashes, delta_logprobs=delta_lp)

    def _release(self, seq: EngineRequest, reason: FinishReason) -> None:
        seq.finish_reason = reason
        self.scheduler.finish(seq)
        self.executor.sampler.forget(seq.request_id)
        self._seqs.pop(seq.request_id, None)

    def _fail(self, seq: EngineRequest, err: InvalidRequestError) -> RequestOutput:
        """End one request alone, with finish_reason "error"; the step's others go on."""
        log.warning("request %s failed alone: %s", seq.request_id, err)
        self._release(seq, "error")
        return self.post.output(seq, [], delta_text="", error=err)

    def abort_all(self) -> list[str]:
        """After a failed step: release every sequence; returns their ids. Prefix hashes are
        forgotten too: a block hashed for a tier load that the failed step never wrote would
        otherwise serve garbage to the next hit (refused while a block is in use)."""
        seqs = {id(s): s for s in [*self._seqs.values(), *self.scheduler.running, *self.scheduler.waiting]}
        ids = [*self._ready, *(s.request_id for s in seqs.values())]
        self._ready.clear()
        for seq in seqs.values():
            self._release(seq, "abort")
        self.scheduler.blocks.tails.clear()  # kept tails would keep the prefix cache from its reset
        if not self.pool.reset_prefix_cache():
            log.warning("blocks still in use after abort_all; the prefix cache was kept")
        return ids

    def generate(
        self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams], cache_salt: str = ""
    ) -> list[RequestOutput]:
        """Run prompts to completion, batched together; outputs in prompt order."""
        per = params if isinstance(params, list) else [params] * len(prompts)
        batch = uuid.uuid4().hex[:8]
        ids = [f"generate-{batch}-{i}" for i in range(len(prompts))]
        try:
            for rid, prompt, p in zip(ids, prompts, per, strict=True):
                self.add_request(GenerationRequest(rid, prompt, p, cache_salt))
        except InvalidRequestError:
            for rid in ids:  # all or nothing: no prompt of a rejected batch stays queued
                self.abort_request(rid)
            raise
        done: dict[str, RequestOutput] = {}
        while self.has_unfinished():
            done.update((out.request_id, out) for out in self.step() if out.finished)
        return [done[rid] for rid in ids]

    def stats(self) -> EngineStats:
        return self.report.stats()

    def check_integrity(self) -> None:
        """Pool invariants, plus: every running sequence's blocks are referenced and sized right."""
        self.report.check_integrity(idle=not self.has_unfinished())
