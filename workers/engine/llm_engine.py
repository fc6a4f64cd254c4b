"""LLMEngine: scheduler + model runner + block pool. One step = schedule, run, postprocess."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import torch

from broker.errors import InvalidRequestError
from broker.sampling import SamplingParams
from kvstore.block_pool import BlockPool
from kvstore.kv_cache import KVCache, KVLayout
from kvstore.stored_block import KVFormat
from kvstore.warm_tier import WarmTier
from workers.engine.block_manager import BlockManager, cdiv
from workers.engine.config import EngineConfig
from workers.engine.detokenizer import Detokenizer
from workers.engine.engine_stats import EngineStats, MemoryBreakdown
from workers.engine.errors import RequestFailedError
from workers.engine.faults import StepFaults
from workers.engine.kv_tiers import TierCache
from workers.engine.model_loader import LoadedModel, load_model
from workers.engine.model_runner import ModelRunner
from workers.engine.request_checks import check_request
from workers.engine.request_output import RequestOutput
from workers.engine.sampler import Sampler
from workers.engine.scheduler import ScheduledSeq, Scheduler
from workers.engine.sequence import FinishReason, Sequence, SequenceStatus

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "kvferry"
log = logging.getLogger(__name__)


def kv_layout(loaded: LoadedModel, block_size: int, dtype: torch.dtype) -> KVLayout:
    cfg = loaded.model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return KVLayout(
        num_layers=cfg.num_hidden_layers,
        num_kv_heads=getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
    )


class LLMEngine:
    """Not thread-safe: one thread owns it (EngineLoop does, for concurrent callers)."""

    def __init__(
        self, config: EngineConfig, loaded: LoadedModel | None = None, cache_dir: Path | None = None
    ) -> None:
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        self.config = config
        self.loaded = loaded or load_model(
            config.model, config.dtype, config.device, cache_dir or DEFAULT_CACHE_DIR
        )
        self.tokenizer = self.loaded.tokenizer
        self.model_id = config.served_model_name or self.loaded.model_id
        dtype = next(self.loaded.model.parameters()).dtype
        device = next(self.loaded.model.parameters()).device
        self.layout = kv_layout(self.loaded, config.block_size, dtype)
        self.kv_cache = KVCache.from_budget(self.layout, config.cache_size_bytes, device)
        self.pool = BlockPool(self.kv_cache.num_blocks, config.block_size, config.enable_prefix_caching)
        self.block_manager = BlockManager(self.pool, self.loaded.fingerprint)
        self.kv_format = KVFormat.from_layout(self.layout, self.loaded.fingerprint)
        self.tiers: TierCache | None = None
        if config.warm_cache_size_bytes > 0 and config.enable_prefix_caching:
            self.tiers = TierCache(
                self.pool, self.kv_cache, self.kv_format, WarmTier(config.warm_cache_size_bytes)
            )
        self.scheduler = Scheduler(config, self.block_manager, self.tiers)
        self.runner = ModelRunner(self.loaded.model, self.kv_cache)
        self.sampler = Sampler(device)
        self.detokenizer = Detokenizer(self.tokenizer)
        self.max_model_len = min(config.max_model_len or self.loaded.max_model_len, self.loaded.max_model_len)
        self.vocab_size = int(self.loaded.model.config.vocab_size)
        self._seqs: dict[str, Sequence] = {}
        self._ready: dict[str, RequestOutput] = {}  # resumed requests complete on arrival
        self.faults = StepFaults(config)
        # Why each request that the last step failed alone failed (finish_reason "error").
        self.last_errors: dict[str, InvalidRequestError] = {}
        self.num_steps = 0
        self.max_batch_seqs = 0
        self.max_batch_tokens = 0
        self.prompt_tokens_computed = 0
        self.generation_tokens = 0

    @staticmethod
    def bytes_per_block(loaded: LoadedModel, block_size: int) -> int:
        dtype = next(loaded.model.parameters()).dtype
        return kv_layout(loaded, block_size, dtype).bytes_per_block

    # -- requests ---------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        cache_salt: str = "",
        output_token_ids: list[int] | None = None,
        streamed_chars: int = 0,
    ) -> None:
        """Queue a request. Raises InvalidRequestError (nothing queued) when it cannot run.

        output_token_ids resumes a request that another process had started (a redelivered job):
        those tokens count as output already made, and the first streamed_chars of their text as
        already sent to the client.
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
        seq = Sequence(request_id, list(prompt_token_ids), params, max_tokens, cache_salt)
        if output_token_ids:
            seq.output_token_ids = list(output_token_ids)
            try:
                stop = self.detokenizer.update(seq)
            except Exception as exc:
                raise RequestFailedError.wrap(exc, "detokenize") from exc
            seq.num_streamed_chars = min(streamed_chars, len(seq.output_text))
            reason = self._resumed_reason(seq, stop)
            if reason is not None:  # its worker died after the last token, before the result
                seq.finish_reason, seq.status = reason, SequenceStatus.FINISHED
                self._ready[request_id] = self._output(seq, [])
                return
        self._seqs[request_id] = seq
        self.scheduler.add(seq)

    def _resumed_reason(self, seq: Sequence, stop: str | None) -> FinishReason | None:
        """Why a resumed output is already complete (the next step would not have run), if it is."""
        if not seq.params.ignore_eos and any(t in self.loaded.eos_token_ids for t in seq.output_token_ids):
            return "stop"
        if stop is not None:
            seq.stop_reason = stop
            return "stop"
        if len(seq.output_token_ids) >= seq.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

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
        scheduled = self.scheduler.schedule()
        self.faults.on_step(scheduled)
        outputs = [
            *self._ready.values(),
            *(self._finish(seq, "length", []) for seq in self.scheduler.outgrown),
        ]
        self._ready.clear()
        self.scheduler.outgrown.clear()
        if not scheduled:
            return outputs
        for block_id, stored in self.block_manager.take_loads():
            self.kv_cache.write_block(block_id, stored.kv)
        logits = self.runner.run(scheduled)
        sampling = [s for s in scheduled if s.samples]
        requests = [(s.seq.request_id, s.seq.params) for s in sampling]
        tokens = self.sampler.sample_isolated(logits, requests) if sampling else []
        self._account(scheduled)
        for item in scheduled:
            prev = item.seq.num_computed_tokens
            item.seq.num_computed_tokens += item.num_new_tokens
            self.block_manager.commit(item.seq, prev)
        for item, token in zip(sampling, tokens, strict=True):
            if isinstance(token, Exception):
                outputs.append(self._fail(item.seq, RequestFailedError.wrap(token, "sampling")))
            else:
                outputs.append(self._append_token(item.seq, token))
        return outputs

    def _account(self, scheduled: list[ScheduledSeq]) -> None:
        self.num_steps += 1
        self.max_batch_seqs = max(self.max_batch_seqs, len(scheduled))
        num_tokens = sum(s.num_new_tokens for s in scheduled)
        self.max_batch_tokens = max(self.max_batch_tokens, num_tokens)
        for s in scheduled:
            start = s.seq.num_computed_tokens
            self.prompt_tokens_computed += max(
                0, min(start + s.num_new_tokens, s.seq.num_prompt_tokens) - start
            )

    def _append_token(self, seq: Sequence, token: int) -> RequestOutput:
        seq.output_token_ids.append(token)
        self.generation_tokens += 1
        reason: FinishReason | None = None
        if not seq.params.ignore_eos and token in self.loaded.eos_token_ids:
            reason, seq.stop_reason = "stop", token
        try:
            stop = self.detokenizer.update(seq)
        except Exception as exc:
            return self._fail(seq, RequestFailedError.wrap(exc, "detokenize"))
        if reason is None and stop is not None:
            reason, seq.stop_reason = "stop", stop
        if reason is None and (
            len(seq.output_token_ids) >= seq.max_tokens or seq.num_tokens >= self.max_model_len
        ):
            reason = "length"
        if reason is not None:
            return self._finish(seq, reason, [token])
        return self._output(seq, [token])

    def _finish(self, seq: Sequence, reason: FinishReason, delta: list[int]) -> RequestOutput:
        seq.finish_reason = reason
        if self.tiers is not None and reason in ("stop", "length") and seq.block_hashes:
            self.tiers.persist(
                seq.block_ids, seq.block_hashes, seq.token_ids, self.block_manager.root(seq.cache_salt)
            )
        self.scheduler.finish(seq)
        self.sampler.forget(seq.request_id)
        del self._seqs[seq.request_id]
        return self._output(seq, delta)

    def _release(self, seq: Sequence, reason: FinishReason) -> None:
        """Free seq's blocks and forget it, persisting nothing (it failed, or the engine did)."""
        seq.finish_reason = reason
        self.scheduler.finish(seq)
        self.sampler.forget(seq.request_id)
        self._seqs.pop(seq.request_id, None)

    def _fail(self, seq: Sequence, err: InvalidRequestError) -> RequestOutput:
        """End one request alone, with finish_reason "error"; the step's others go on."""
        log.warning("request %s failed alone: %s", seq.request_id, err)
        self.last_errors[seq.request_id] = err
        self._release(seq, "error")
        return self._output(seq, [], delta_text="", error=str(err))

    def abort_all(self) -> list[str]:
        """After a failed step: release every sequence; returns their ids.

        Prefix hashes are forgotten too: a block hashed for a tier load that the failed step never
        wrote would otherwise serve garbage to the next hit (refused while a block is in use)."""
        seqs = {id(s): s for s in [*self._seqs.values(), *self.scheduler.running, *self.scheduler.waiting]}
        ids = [*self._ready, *(s.request_id for s in seqs.values())]
        self._ready.clear()
        for seq in seqs.values():
            self._release(seq, "abort")
        self.scheduler.outgrown.clear()
        self.block_manager.take_loads()
        self.block_manager.tails.clear()  # held blocks would keep the prefix cache from its reset
        self.last_errors = {}
        if not self.pool.reset_prefix_cache():
            log.warning("blocks still in use after abort_all; the prefix cache was kept")
        return ids

    def _output(
        self, seq: Sequence, delta: list[int], delta_text: str | None = None, error: str | None = None
    ) -> RequestOutput:
        return RequestOutput(
            request_id=seq.request_id,
            delta_token_ids=tuple(delta),
            delta_text=self.detokenizer.stream_delta(seq) if delta_text is None else delta_text,
            finished=seq.is_finished,
            finish_reason=seq.finish_reason,
            token_ids=tuple(seq.output_token_ids),
            text=seq.output_text,
            prompt_tokens=seq.num_prompt_tokens,
            # a resumed request also matches its earlier output: count prompt tokens only
            cached_tokens=min(seq.num_prompt_tokens, max(0, seq.num_cached_tokens) + seq.num_warm_tokens),
            pool_tokens=max(0, seq.num_cached_tokens),
            warm_tokens=seq.num_warm_tokens - seq.num_redis_tokens,
            redis_tokens=seq.num_redis_tokens,
            error=error,
        )

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
        stats = self.pool.stats()
        per = self.layout.bytes_per_block
        return MemoryBreakdown(
            weights_bytes=self.loaded.weights_bytes,
            pool_bytes=self.kv_cache.nbytes,
            used_bytes=stats.blocks_used * per,
            cached_bytes=stats.blocks_cached * per,
            free_bytes=stats.blocks_free * per,
        )

    def stats(self) -> EngineStats:
        return EngineStats(
            model_id=self.model_id,
            bytes_per_block=self.layout.bytes_per_block,
            pool=self.pool.stats(),
            memory=self.memory_breakdown(),
            num_steps=self.num_steps,
            num_preemptions=self.scheduler.num_preemptions,
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            max_batch_seqs=self.max_batch_seqs,
            max_batch_tokens=self.max_batch_tokens,
            prompt_tokens_computed=self.prompt_tokens_computed,
            generation_tokens=self.generation_tokens,
        )

    def check_integrity(self) -> None:
        """Pool invariants, plus: every running sequence's blocks are referenced and sized right."""
        self.pool.check_integrity()
        for seq in self.scheduler.running:
            assert len(seq.block_ids) >= cdiv(seq.num_computed_tokens, self.pool.block_size), seq.request_id
            assert all(self.pool.blocks[b].ref_cnt > 0 for b in seq.block_ids), seq.request_id
        for seq in self.scheduler.waiting:
            assert not seq.block_ids, seq.request_id
        if not self.has_unfinished():
            kept = len(self.block_manager.tails)  # partial blocks of finished session turns
            assert self.pool.stats().blocks_used == kept, "blocks leaked after all requests finished"
