"""EngineService: one per worker process. Builds the engine lazily on the first job (never at
import time), runs jobs through its loop, and streams their tokens to Redis."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from broker import job_events, keys, session_store
from broker.errors import InvalidRequestError, UnknownModelError
from broker.messages import (
    ChatMessage,
    EngineFigures,
    GenerateJob,
    GenerateResult,
    JobDone,
    JobFailed,
    SessionRecord,
    TokenDelta,
    Usage,
    WorkerStatus,
)
from broker.prefix_digest import chat_digests, text_digests
from kvstore.block_hash import hash_blocks, root_hash
from kvstore.redis_tier import RedisTier
from workers.engine.config import EngineConfig
from workers.engine.engine_loop import EngineLoop
from workers.engine.llm_engine import LLMEngine
from workers.kv_writer import KVWriter
from workers.prefetch import prefetch
from workers.prompt import prompt_token_ids

STREAM_FLUSH_S = 0.03


@dataclass(frozen=True, slots=True)
class TierConfig:
    redis_capacity_bytes: int = 2 * 1024**3  # the shared Redis tier's byte cap; 0 = no Redis tier
    session_ttl_s: int = 3600
    prefix_digests_kept: int = 50_000  # per worker, for routing


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    name: str  # the Celery node name, e.g. "w1@host"

    @property
    def queue(self) -> str:
        return keys.worker_queue(self.name)


class EngineService:
    def __init__(
        self,
        config: EngineConfig,
        cache_dir: Path,
        redis_url: str,
        identity: WorkerIdentity,
        tiers: TierConfig | None = None,
    ) -> None:
        self.config = config
        self.tier_config = tiers or TierConfig()
        self.redis_tier: RedisTier | None = None
        self.writer: KVWriter | None = None
        self.cache_dir = cache_dir
        self.identity = identity
        self.served_model = config.served_model_name or config.model
        self.redis = redis.Redis.from_url(redis_url)
        self._lock = threading.Lock()
        self._loop: EngineLoop | None = None
        self.jobs_running = 0
        self.jobs_done = 0
        self.jobs_failed = 0

    def loop(self) -> EngineLoop:
        with self._lock:
            if self._loop is None:
                engine = LLMEngine(self.config, cache_dir=self.cache_dir)
                if self.tier_config.redis_capacity_bytes > 0 and engine.tiers is not None:
                    self.redis_tier = RedisTier(
                        self.redis, engine.kv_format, self.tier_config.redis_capacity_bytes
                    )
                    self.writer = KVWriter(self.redis_tier)
                    engine.tiers.cold_sink = self.writer.enqueue
                self._loop = EngineLoop(engine).start()
            return self._loop

    def shutdown(self) -> None:
        with self._lock:
            if self._loop is not None:
                self._loop.stop()
                self._loop = None
            if self.writer is not None:
                self.writer.stop()
                self.writer = None

    def _count(self, running: int = 0, done: int = 0, failed: int = 0) -> None:
        with self._lock:
            self.jobs_running += running
            self.jobs_done += done
            self.jobs_failed += failed

    def run(self, job_id: str, job: GenerateJob) -> GenerateResult:
        """Run one job to its end. Raises the typed error after streaming it, so Celery marks the
        job failed. A redelivered job resumes after the tokens its stream already holds."""
        started = time.time()
        self._count(running=1)
        self.redis.sadd(keys.worker_jobs(self.identity.name), job_id)
        try:
            result = self._run(job_id, job, started)
            self._count(done=1)
            return result
        except InvalidRequestError as exc:
            self._count(failed=1)
            kind, status = (
                ("not_found_error", 404)
                if isinstance(exc, UnknownModelError)
                else ("invalid_request_error", 400)
            )
            job_events.publish(self.redis, job_id, JobFailed(kind, exc.message, status, exc.param))
            raise
        except Exception as exc:
            self._count(failed=1)
            job_events.publish(
                self.redis, job_id, JobFailed("server_error", f"{type(exc).__name__}: {exc}", 500)
            )
            raise
        finally:
            self._count(running=-1)
            self.redis.srem(keys.worker_jobs(self.identity.name), job_id)

    def _run(self, job_id: str, job: GenerateJob, started: float) -> GenerateResult:
        if job.model != self.served_model:
            raise UnknownModelError(
                f"model {job.model!r} is not served (this worker serves {self.served_model!r})"
            )
        before = job_events.progress(self.redis, job_id)
        if before.done is not None:  # finished before a redelivery: the same answer again
            return before.done.result
        loop = self.loop()
        ids = prompt_token_ids(job, loop.engine.tokenizer)
        self._prefetch(loop.engine, ids, job.tenant)
        handle = loop.submit(
            ids,
            job.params,
            request_id=job_id,
            cache_salt=job.tenant,
            output_token_ids=before.token_ids,
            streamed_chars=before.text_chars,
        )
        if self.redis.exists(keys.job_cancel(job_id)):
            handle.cancel()
        first_token_at = None
        final = None
        texts: list[str] = []
        token_ids: list[int] = []
        last_publish = 0.0
        for out in handle:
            if out.delta_token_ids and first_token_at is None:
                first_token_at = time.time()
            texts.append(out.delta_text)
            token_ids.extend(out.delta_token_ids)
            now = time.monotonic()
            # The first token goes out at once; later ones ride together within STREAM_FLUSH_S
            # (one XADD per step per job costs the worker, Redis, the api and the client alike).
            if (token_ids or any(texts)) and (out.finished or now - last_publish >= STREAM_FLUSH_S):
                event = TokenDelta("".join(texts), tuple(token_ids))
                texts, token_ids, last_publish = [], [], now
                if job_events.publish(self.redis, job_id, event, check_cancel=not out.finished):
                    handle.cancel()
            final = out
        assert final is not None and final.finish_reason is not None
        now = time.time()
        submitted = job.submitted_at or started
        result = GenerateResult(
            job_id=job_id,
            model=self.served_model,
            text=final.text,
            token_ids=final.token_ids,
            finish_reason=final.finish_reason,
            usage=Usage(
                final.prompt_tokens,
                final.completion_tokens,
                final.cached_tokens,
                pool_tokens=final.pool_tokens,
                warm_tokens=final.warm_tokens,
                redis_tokens=final.redis_tokens,
            ),
            worker=self.identity.name,
            queue_wait_s=max(0.0, started - submitted),
            ttft_s=(first_token_at or now) - submitted,
            latency_s=now - submitted,
        )
        if final.finish_reason in ("stop", "length"):
            self._remember(job, loop.engine, ids, final.token_ids, final.text)
        job_events.publish(self.redis, job_id, JobDone(result))
        return result

    def _prefetch(self, engine: LLMEngine, ids: list[int], tenant: str) -> None:
        if self.redis_tier is not None:
            prefetch(engine, self.redis_tier, ids, tenant)

    def _remember(
        self, job: GenerateJob, engine: LLMEngine, ids: list[int], output: tuple[int, ...], text: str
    ) -> None:
        """After a turn: the prefix digests that route the next turn here, and the session record
        (any worker can resume it)."""
        now = time.time()
        digests = self._digests(job, text)
        if digests:
            key = keys.worker_prefixes(self.identity.name)
            pipe = self.redis.pipeline(transaction=False)
            pipe.zadd(key, dict.fromkeys(digests, now))
            pipe.zremrangebyrank(key, 0, -self.tier_config.prefix_digests_kept - 1)
            pipe.expire(key, 86400)
            pipe.execute()
        bs = engine.pool.block_size
        if job.pin_prefix and self.writer is not None and self.redis_tier is not None:
            self.writer.flush()
            self.redis_tier.pin(
                hash_blocks(
                    ids[: (len(ids) // bs) * bs],
                    bs,
                    (),
                    parent=root_hash((engine.loaded.fingerprint, job.tenant)),
                )
            )
        if not job.session_id:
            return
        tokens = [*ids, *output]
        root = root_hash((engine.loaded.fingerprint, job.tenant))
        hashes = hash_blocks(tokens[: (len(tokens) // bs) * bs], bs, (), parent=root)
        previous = session_store.load(self.redis, job.session_id)
        record = SessionRecord(
            session_id=job.session_id,
            tenant=job.tenant,
            model=self.served_model,
            token_ids=tuple(tokens),
            block_hashes=tuple(h.hex() for h in hashes),
            last_worker=self.identity.name,
            last_used=now,
            turns=(previous.turns if previous else 0) + 1,
        )
        if self.writer is not None and self.redis_tier is not None:
            self.writer.flush()  # the turn's blocks are in Redis before the session says they are
            held = set(previous.block_hashes) if previous else set()
            self.redis_tier.pin([h for h in hashes if h.hex() not in held])
        session_store.save(self.redis, record, self.tier_config.session_ttl_s)

    def _digests(self, job: GenerateJob, text: str) -> list[str]:
        if job.endpoint == "chat" and job.messages:
            return chat_digests(job.model, job.tenant, (*job.messages, ChatMessage("assistant", text)))
        if job.prompt:
            return text_digests(job.model, job.tenant, job.prompt + text)
        return []

    def sweep_sessions(self) -> int:
        """Release what expired (or forgotten) sessions pinned; returns how many were swept."""
        records = session_store.claim_expired(self.redis)
        if self.redis_tier is not None:
            for record in records:
                self.redis_tier.unpin([bytes.fromhex(h) for h in record.block_hashes])
        return len(records)

    def status(self) -> WorkerStatus:
        """Figures for the heartbeat; engine figures are read on its own thread, between steps."""
        with self._lock:
            loop, running, done, failed = self._loop, self.jobs_running, self.jobs_done, self.jobs_failed
        figures = None
        if loop is not None:
            stats = loop.call(lambda e: e.stats(), timeout=10)
            pool = stats.pool
            figures = EngineFigures(
                num_running=stats.num_running,
                num_waiting=stats.num_waiting,
                num_steps=stats.num_steps,
                max_batch_seqs=stats.max_batch_seqs,
                generation_tokens=stats.generation_tokens,
                pool_blocks_total=pool.blocks_total,
                pool_blocks_used=pool.blocks_used,
                pool_blocks_cached=pool.blocks_cached,
                bytes_per_block=stats.bytes_per_block,
                prefix_cache_queries_tokens=pool.prefix_cache_queries_tokens,
                prefix_cache_hits_tokens=pool.prefix_cache_hits_tokens,
                fragmentation=pool.fragmentation,
                weights_bytes=stats.memory.weights_bytes,
                pool_bytes=stats.memory.pool_bytes,
            )
        return WorkerStatus(
            name=self.identity.name,
            queue=self.identity.queue,
            model=self.served_model,
            jobs_running=running,
            jobs_done=done,
            jobs_failed=failed,
            sent_at=time.time(),
            engine=figures,
        )
