"""LLMEngine: scheduler + model runner + block pool. One step = schedule, run, postprocess."""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path

import torch

from broker.errors import InvalidRequestError
from broker.priority import JobClass
from broker.sampling import SamplingParams
from kvstore.layout import KVFormat
from kvstore.pool.block_pool import BlockPool
from kvstore.pool.kv_cache import KVCache
from kvstore.tiers.stored_block import StoredBlock
from kvstore.tiers.warm import WarmTier
from workers.engine import logprobs
from workers.engine.block_manager import BlockManager
from workers.engine.config import EngineConfig
from workers.engine.errors import RequestFailedError
from workers.engine.faults import StepFaults
from workers.engine.grammar.compiler import GrammarCompiler
from workers.engine.grammar.matcher import CompiledGrammar
from workers.engine.kernels import block_writer
from workers.engine.model.kv_layout import kv_layout
from workers.engine.model.loader import LoadedModel, load_model
from workers.engine.model.precision import Precision
from workers.engine.model_runner import ModelRunner
from workers.engine.postprocess import Postprocessor
from workers.engine.report import EngineReport
from workers.engine.requests.checks import check_request
from workers.engine.requests.detokenizer import Detokenizer
from workers.engine.requests.logprob import Logprob
from workers.engine.requests.output import RequestOutput
from workers.engine.requests.sequence import EngineRequest, FinishReason, RequestStatus
from workers.engine.sampler import Sampler
from workers.engine.scheduler import Scheduler, SchedulerOutput
from workers.engine.stats import EngineStats, MemoryBreakdown
from workers.engine.step_counters import StepCounters
from workers.engine.tier_bridge import ColdWriter, TierBridge

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "kvferry"
log = logging.getLogger(__name__)


class LLMEngine:
    """Not thread-safe: one thread owns it (EngineLoop does, for concurrent callers)."""

    def __init__(
        self, config: EngineConfig, loaded: LoadedModel | None = None, cache_dir: Path | None = None
    ) -> None:
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        self.config = config
        precision = Precision.resolve(config.dtype, config.kv_cache_dtype, config.device)
        self.loaded, self.precision = precision.apply(
            loaded
            or load_model(config.model, precision.load_dtype, config.device, cache_dir or DEFAULT_CACHE_DIR)
        )
        self.tokenizer = self.loaded.tokenizer
        self.model_id = config.served_model_name or self.loaded.model_id
        self.device = device = next(self.loaded.model.parameters()).device
        self.layout = kv_layout(self.loaded, config.block_size, self.precision.kv_torch)
        self.kv_cache = KVCache.from_budget(self.layout, config.cache_size_bytes, device)
        if device.type == "cpu" and block_writer.available():  # loads streamed into the pool
            self.kv_cache.block_writer = block_writer.write_blocks
        self.pool = BlockPool(self.kv_cache.num_blocks, config.block_size, config.enable_prefix_caching)
        self.block_manager = BlockManager(self.pool, self.loaded.fingerprint)
        self.kv_format = KVFormat.from_layout(self.layout, self.loaded.fingerprint)
        self.tiers: TierBridge | None = None
        if config.warm_cache_size_bytes > 0 and config.enable_prefix_caching:
            self.tiers = TierBridge(
                self.pool, self.kv_cache, self.kv_format, WarmTier(config.warm_cache_size_bytes)
            )
        self.scheduler = Scheduler(config, self.block_manager, self.tiers)
        self.runner = ModelRunner(
            self.loaded.model,
            self.kv_cache,
            packed=config.packed_linear,
            decode_kernel=config.decode_kernel,
            fused_decode=config.fused_decode,
        )
        # Counted once, after the runner packed the linears: stats() runs right after a job's last
        # step, while its task thread waits for the GIL to publish the result.
        self.weights_bytes = self.loaded.weights_bytes
        self.sampler = Sampler(device, self.loaded.eos_token_ids)
        self.detokenizer = Detokenizer(self.tokenizer)
        self.grammars = GrammarCompiler(self.tokenizer, self.loaded.eos_token_ids)  # thread-safe
        self.max_model_len = min(config.max_model_len or self.loaded.max_model_len, self.loaded.max_model_len)
        self.vocab_size = int(self.loaded.model.config.vocab_size)
        self.post = Postprocessor(self.detokenizer, self.loaded.eos_token_ids, self.max_model_len)
        self._seqs: dict[str, EngineRequest] = {}
        self._ready: dict[str, RequestOutput] = {}  # resumed requests complete on arrival
        self.faults = StepFaults(config)
        # Why each request that the last step failed alone failed (finish_reason "error").
        self.last_errors: dict[str, InvalidRequestError] = {}
        self.counters = StepCounters()
        self.report = EngineReport(
            self.model_id,
            self.weights_bytes,
            self.layout,
            self.kv_cache,
            self.pool,
            self.block_manager,
            self.scheduler,
            self.post,
            self.counters,
            self.precision.weights,
        )

    @staticmethod
    def bytes_per_block(loaded: LoadedModel, block_size: int, kv_dtype: torch.dtype | None = None) -> int:
        return kv_layout(loaded, block_size, kv_dtype).bytes_per_block

    # -- requests ---------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        cache_salt: str = "",
        output_token_ids: list[int] | None = None,
        streamed_chars: int = 0,
        keep_tail: bool = False,
        grammar: CompiledGrammar | None = None,
        job_class: JobClass = "interactive",
        priority: int = 0,
    ) -> None:
        """Queue a request. Raises InvalidRequestError (nothing queued) when it cannot run.

        output_token_ids resumes a request that another process had started (a redelivered job):
        those tokens count as output already made, and the first streamed_chars of their text as
        already sent to the client. keep_tail: a session turn, whose next turn starts with its
        partial last block: the pool keeps that block once it finishes (KeptTails). grammar:
        params.structured_outputs compiled by self.grammars (compiled here, on the engine's
        thread, when not given). job_class and priority: its place in the waiting order, and
        whether it yields to interactive requests (workers/engine/scheduler.py).
        """
        if request_id in self._seqs:
            raise InvalidRequestError(f"request id {request_id!r} is already running", "request_id")
        max_tokens = check_request(
            prompt_token_ids,
            params,
            output_token_ids or (),
            vocab_size=self.vocab_size,
            max_model_len=self.max_model_len,
            block_size=self.pool.block_size,
            num_blocks=self.pool.num_blocks,
            default_max_tokens=self.config.default_max_tokens,
        )
        seq = EngineRequest(request_id, list(prompt_token_ids), params, max_tokens, cache_salt)
        seq.job_class, seq.priority = job_class, priority
        if params.structured_outputs is not None:
            compiled = grammar or self.grammars.compile(params.structured_outputs)
            seq.grammar = compiled.matcher() if compiled is not None else None
        if output_token_ids:
            reason = self.post.resume(seq, output_token_ids, streamed_chars)
            if reason is not None:  # its worker died after the last token, before the result
                seq.finish_reason, seq.status = reason, RequestStatus.FINISHED
                self._ready[request_id] = self.post.output(seq, [])
                return
        if keep_tail:
            self.block_manager.tails.want(request_id)
        self._seqs[request_id] = seq
        self.scheduler.add(seq)

    @property
    def spills(self) -> bool:
        """Whether blocks leaving the pool go on to the warm tier (and a cold writer, if attached)."""
        return self.tiers is not None

    def attach_cold_writer(self, writer: ColdWriter) -> None:
        """Write what leaves the pool, and every finished turn, to the cold tier through `writer`."""
        if self.tiers is not None:
            self.tiers.attach(writer)

    def admit_prefetched(self, blocks: list[StoredBlock]) -> None:
        """Blocks a task thread fetched from Redis for a prompt: into the warm tier."""
        if self.tiers is not None and blocks:
            self.tiers.admit(blocks)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        if request_id in self._ready:
            return self._ready.pop(request_id)
        seq = self._seqs.get(request_id)
        if seq is None:
            return None
        return self._finish(seq, "abort", [])

    def has_unfinished(self) -> bool:
        return bool(self._ready) or self.scheduler.has_unfinished()

    # -- the step -----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One batch. A request whose sampling or detokenising raises ends alone with
        finish_reason "error" (its reason in last_errors); anything else that raises is the
        engine's failure: the caller must then call abort_all() before stepping again."""
        self.last_errors = {}
        started = time.perf_counter()
        step = self.scheduler.schedule()
        self.faults.on_step(step.scheduled)
        outputs = [*self._ready.values(), *(self._finish(seq, "length", []) for seq in step.outgrown)]
        self._ready.clear()
        if not step.scheduled:
            return outputs
        done = self._postprocess(step, self._run(step))
        elapsed = time.perf_counter() - started
        self.scheduler.cost.record(step.num_decodes, step.num_prefill_tokens, elapsed)
        return [*outputs, *done]

    def _run(self, step: SchedulerOutput) -> tuple[list[int | Exception], list[Logprob | None]]:
        """Tier loads, the forward, sampling: one token (or its request's error) per sampling seq,
        with its logprob where asked; prompt logprobs go to their sequences."""
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
            return [], []
        tokens = self.sampler.sample_isolated(out.sample, seqs)
        return tokens, logprobs.sampled(out.sample, seqs, tokens)

    def _postprocess(
        self, step: SchedulerOutput, sampled: tuple[list[int | Exception], list[Logprob | None]]
    ) -> list[RequestOutput]:
        sampling = [s for s in step.scheduled if s.samples]  # before the progress below moves on
        self.counters.account(step)
        for item in step.scheduled:
            prev = item.seq.num_computed_tokens
            item.seq.num_computed_tokens += item.num_new_tokens
            self.block_manager.commit(item.seq, prev)
        outputs = []
        for item, token, lp in zip(sampling, *sampled, strict=True):
            if isinstance(token, Exception):
                outputs.append(self._fail(item.seq, RequestFailedError.wrap(token, "sampling")))
                continue
            if item.seq.max_tokens == 0:  # the prompt alone was asked for (echo): nothing sampled
                outputs.append(self._finish(item.seq, "length", []))
                continue
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
        seq.finish_reason = reason
        hashes = tuple(seq.block_hashes)  # before finish() frees the blocks and forgets them
        if self.tiers is not None and reason in ("stop", "length") and hashes:
            self.tiers.persist(seq.block_ids, hashes, seq.token_ids, self.block_manager.root(seq.cache_salt))
        self.scheduler.finish(seq)
        self.sampler.forget(seq.request_id)
        del self._seqs[seq.request_id]
        return self.post.output(seq, delta, block_hashes=hashes, delta_logprobs=delta_lp)

    def _release(self, seq: EngineRequest, reason: FinishReason) -> None:
        """Free seq's blocks and forget it, persisting nothing (it failed, or the engine did)."""
        seq.finish_reason = reason
        self.scheduler.finish(seq)
        self.sampler.forget(seq.request_id)
        self._seqs.pop(seq.request_id, None)

    def _fail(self, seq: EngineRequest, err: InvalidRequestError) -> RequestOutput:
        """End one request alone, with finish_reason "error"; the step's others go on."""
        log.warning("request %s failed alone: %s", seq.request_id, err)
        self.last_errors[seq.request_id] = err
        self._release(seq, "error")
        return self.post.output(seq, [], delta_text="", error=str(err))

    def abort_all(self) -> list[str]:
        """After a failed step: release every sequence; returns their ids.

        Prefix hashes are forgotten too: a block hashed for a tier load that the failed step never
        wrote would otherwise serve garbage to the next hit (refused while a block is in use)."""
        seqs = {id(s): s for s in [*self._seqs.values(), *self.scheduler.running, *self.scheduler.waiting]}
        ids = [*self._ready, *(s.request_id for s in seqs.values())]
        self._ready.clear()
        for seq in seqs.values():
            self._release(seq, "abort")
        self.block_manager.tails.clear()  # held blocks would keep the prefix cache from its reset
        self.last_errors = {}
        if not self.pool.reset_prefix_cache():
            log.warning("blocks still in use after abort_all; the prefix cache was kept")
        return ids

    # -- convenience and figures --------------------------------------------------------------

    def generate(
        self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams], cache_salt: str = ""
    ) -> list[RequestOutput]:
        """Run prompts to completion, batched together; outputs in prompt order."""
        per = params if isinstance(params, list) else [params] * len(prompts)
        batch = uuid.uuid4().hex[:8]
        ids = [f"generate-{batch}-{i}" for i in range(len(prompts))]
        try:
            for rid, prompt, p in zip(ids, prompts, per, strict=True):
                self.add_request(rid, prompt, p, cache_salt)
        except InvalidRequestError:
            for rid in ids:  # all or nothing: no prompt of a rejected batch stays queued
                self.abort_request(rid)
            raise
        done: dict[str, RequestOutput] = {}
        while self.has_unfinished():
            for out in self.step():
                if out.finished:
                    done[out.request_id] = out
        return [done[rid] for rid in ids]

    def memory_breakdown(self) -> MemoryBreakdown:
        return self.report.memory()

    def stats(self) -> EngineStats:
        return self.report.stats()

    def check_integrity(self) -> None:
        """Pool invariants, plus: every running sequence's blocks are referenced and sized right."""
        self.report.check_integrity(idle=not self.has_unfinished())
