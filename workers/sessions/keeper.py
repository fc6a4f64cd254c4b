"""SessionKeeper: what a finished turn leaves behind for the next one. The prefix digests that
route the next turn here, the session record (any worker can resume it) and the pins that keep
its blocks in the Redis tier; and the sweep that releases what expired sessions pinned.

A session is (job.tenant, job.session_id): another tenant's turn with the same id is its own session.
Order: the record is saved before the pins are set, so a crash between the two leaves a session
under-pinned, never pins without a session; pins set after the session was deleted and swept are
found by reconcile_orphans.

A turn's bookkeeping comes in two parts, so its answer never waits for the KV write queue:
- remember(), before the answer is published: the routing digests, and the record with the turn's
  exact tokens (a client's next turn, sent the moment it has the answer, reuses them: token-exact),
  naming only the chain's blocks that are in Redis already (none of the writes still queued);
- after_write(), after the answer: once the writer has written the turn's blocks (and those queued
  before them), the record names the whole chain and the pins follow it, on the AfterWriteQueue's thread;
  then, at a forced move's turn K, the worker turn K+1 moves to (job.prefetch_to, kept in the
  record as next_worker) gets a prefetch hint: it loads the history while the client thinks.
  Newer wins as ever: a later turn's record is never overwritten by an earlier turn's after-write work."""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from typing import TYPE_CHECKING, Protocol

import msgspec
import redis

from broker import keys
from broker.messages import ChatMessage, GenerateJob, SessionRecord
from broker.routing import prefetch_hint, prefix_index
from broker.routing.prefix_digest import chat_digests, text_digests
from broker.sessions import store as session_store
from broker.sessions import tokens as session_tokens
from broker.sessions.tokens import SessionTokens
from kvstore.chain import chain
from kvstore.redis import pins as tier_pins
from kvstore.redis.client import KV_ERRORS, KVClient
from kvstore.redis.keys import TierKeys
from workers.engine.requests.output import RequestOutput
from workers.sessions.after_write import AfterWrite, AfterWriteQueue
from workers.tiers.config import TierConfig

if TYPE_CHECKING:  # torch's: a worker in the simulated mode never loads them
    from kvstore.redis.tier import RedisTier
    from workers.tiers.writer import KVWriter

log = logging.getLogger(__name__)
FLUSH_TIMEOUT_S = 30.0  # the longest a preload waits for its blocks to reach Redis
ORPHAN_GRACE_S = 120.0  # a session owner this long without a session record is an orphan
RECONCILE_EVERY_S = 60.0
# A digest this worker advertised is written again after this long (its holders key expires a day
# after its last write: broker/routing/prefix_index.py).
ADVERTISE_EVERY_S = 600.0


class ChainFacts(Protocol):
    """What hashing a turn's chain needs of the engine (workers/loop/engine_loop.EngineLoop)."""

    block_size: int
    fingerprint: str


class SessionKeeper:
    def __init__(
        self,
        client: redis.Redis,
        kv_redis: KVClient,
        worker: str,
        served_model: str,
        tier_config: TierConfig,
    ) -> None:
        self.redis = client
        self.kv_redis = kv_redis
        self.worker = worker
        self.served_model = served_model
        self.tier_config = tier_config
        # Built with the engine, on the first job (attach): None until then, or with no tier.
        self.redis_tier: RedisTier | None = None
        self.writer: KVWriter | None = None
        self._reconciled_at = 0.0
        self.after_writes = AfterWriteQueue()
        self._advertised: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._advertised_lock = threading.Lock()

    def attach(self, tier: RedisTier, writer: KVWriter) -> None:
        """The Redis tier and its writer, once the engine that feeds them is built."""
        self.redis_tier, self.writer = tier, writer

    def detach(self) -> None:
        self.redis_tier = self.writer = None

    def remember(
        self,
        job: GenerateJob,
        engine: ChainFacts,
        ids: list[int],
        final: RequestOutput,
        stored: SessionTokens | None = None,
    ) -> AfterWrite | None:
        """Before a turn's answer: the prefix digests that route the next turn here and the session
        record (any worker can resume it) with the turn's exact tokens, naming the blocks in Redis
        already. Returns what after_write() does after the answer (the rest of the record, the pins), if
        anything. `final`: the turn's last output, with the block hashes the engine computed (only
        the blocks after them are hashed here). `stored`: the session's exact tokens as the turn
        found them (their earlier checkpoints carry on)."""
        output, text = final.token_ids, final.text
        now = time.time()
        self._advertise(self._digests(job, text), now)
        bs, fingerprint, known = engine.block_size, engine.fingerprint, final.block_hashes
        tier, writer = self.redis_tier, self.writer
        if tier is None or writer is None:
            tier = writer = None
        mark = writer.mark() if writer is not None else -1
        if job.pin_prefix and tier is not None and writer is not None:
            # A preload's answer means "pinned": it waits for its own writes (ordered, not the queue).
            written = threading.Event()
            writer.after_written(mark, written.set)
            written.wait(FLUSH_TIMEOUT_S)
            try:
                tier.pin_preload(job.tenant, chain(ids, bs, fingerprint, job.kv_salt, known))
            except KV_ERRORS as exc:  # a KV shard away: unpinned blocks, a recompute at worst
                log.warning("pinning the prompt's blocks failed: %s", exc)
        if not job.session_id:
            return None
        tokens = [*ids, *output]
        hashes = chain(tokens, bs, fingerprint, job.kv_salt, known)
        previous = session_store.load(self.redis, job.tenant, job.session_id)
        record = SessionRecord(
            session_id=job.session_id,
            tenant=job.tenant,
            model=self.served_model,
            token_ids=tuple(tokens),
            block_hashes=tuple(h.hex() for h in hashes),
            last_used=now,
            last_worker=self.worker,
            turns=(previous.turns if previous else 0) + 1,
            next_worker=job.prefetch_to,
        )
        exact = None
        if job.endpoint == "chat" and job.messages and not job.prompt_token_ids:
            conversation = (*job.messages, ChatMessage("assistant", text))
            exact = session_tokens.after_turn(stored, job.model, conversation, tokens)
        began = job.submitted_at or now
        pending = writer.pending() if writer is not None else set()
        ready = sum(1 for _ in itertools.takewhile(lambda h: h not in pending, hashes))
        first = msgspec.structs.replace(record, block_hashes=record.block_hashes[:ready])
        ttl_s = self.tier_config.session_ttl_s
        if not session_store.save(self.redis, first, ttl_s, began, exact):
            return None  # a newer turn finished first (its record and pins stand), or it was deleted
        if tier is None:
            return None

        def finish_record() -> None:
            if ready < len(hashes) and not session_store.save(self.redis, record, ttl_s, began, exact):
                return  # a newer turn saved its record meanwhile, or the session was deleted
            assert tier is not None and job.session_id
            try:
                tier.pin_session(job.tenant, job.session_id, hashes, version=now)
            except KV_ERRORS as exc:  # a KV shard away (RedisClusterException is no RedisError)
                log.warning("session %s: pinning its blocks failed: %s", job.session_id, exc)
            if job.prefetch_to and job.prefetch_to != self.worker:  # turn K+1 moves there: warm it
                prefetch_hint.send(self.redis, job.prefetch_to, prefetch_hint.for_job(job))

        return AfterWrite(mark, finish_record)

    def after_write(self, pending: AfterWrite) -> None:
        """After the turn's answer: its after-write work, once the KV writer has written up to its mark
        (the turn's blocks), on the AfterWriteQueue's thread (never on the caller's or the writer's)."""
        writer = self.writer
        if writer is None:  # detached meanwhile: nothing of it was written here
            return
        writer.after_written(pending.mark, lambda: self.after_writes.submit(pending.work))

    @property
    def bookkeeping_failures(self) -> int:
        return self.after_writes.failures

    def stored_tokens(self, job: GenerateJob) -> SessionTokens | None:
        """The exact tokens the session's last turn ended with, for workers/jobs/prompt.py to reuse."""
        if not job.session_id or job.endpoint != "chat" or not job.messages or job.prompt_token_ids:
            return None
        try:
            return session_store.load_tokens(self.redis, job.tenant, job.session_id)
        except redis.RedisError as exc:  # costs this turn a re-tokenisation, nothing more
            log.warning("session %s: cannot read its exact tokens: %s", job.session_id, exc)
            return None

    def _advertise(self, digests: list[str], now: float) -> None:
        """The prefix digests that route the next turn here (broker/routing/prefix_index.py), each at most
        once per ADVERTISE_EVERY_S: a conversation's earlier digests cost no write per turn."""
        with self._advertised_lock:  # jobs' threads finish turns at once
            fresh = [d for d in digests if now - self._advertised.get(d, 0.0) >= ADVERTISE_EVERY_S]
            for d in fresh:
                self._advertised[d] = now
                self._advertised.move_to_end(d)
            while len(self._advertised) > self.tier_config.prefix_digests_kept:
                self._advertised.popitem(last=False)
        if fresh:
            pipe = self.redis.pipeline(transaction=False)
            prefix_index.advertise(pipe, self.worker, fresh, now)
            pipe.execute()

    def _digests(self, job: GenerateJob, text: str) -> list[str]:
        if job.endpoint == "chat" and job.messages:
            return chat_digests(job.model, job.kv_salt, (*job.messages, ChatMessage("assistant", text)))
        if job.prompt:
            return text_digests(job.model, job.kv_salt, job.prompt + text)
        return []

    def sweep_sessions(self, counts: collections.Counter[str] | None = None) -> int:
        """Release what expired (or deleted) sessions pinned, in every model's tier (even with no
        engine loaded here: the claim is ours alone); returns how many were swept. Only the fleet's
        sweeper runs it (workers/jobs/maintenance.py). Each session fails alone (logged, counted in
        `counts`): what it pinned is then released by reconcile_orphans."""
        claimed = session_store.claim_expired(self.redis)
        for tenant, session_id in claimed:
            try:
                tier_pins.release_session(self.kv_redis, tenant, session_id)
            except Exception as exc:  # the KV Redis away: reconcile_orphans releases them later
                log.warning("session %s: its pins were not released: %r", session_id, exc)
                if counts is not None:
                    counts["session_release_failed"] += 1
        if time.monotonic() - self._reconciled_at >= RECONCILE_EVERY_S:
            self._reconciled_at = time.monotonic()
            self.reconcile_orphans()
        return len(claimed)

    def reconcile_orphans(self, grace_s: float = ORPHAN_GRACE_S) -> int:
        """Release session pins whose session is gone (a turn that pinned after its session was
        deleted and swept); returns the owners released."""
        released = 0
        now = time.time()
        for fp in tier_pins.fingerprints(self.kv_redis):
            k = TierKeys(fp)
            stale = [
                o for o, at in tier_pins.owners(self.kv_redis, k) if o.kind == "s" and at < now - grace_s
            ]
            if not stale:
                continue
            pipe = self.redis.pipeline(transaction=False)
            for owner in stale:
                pipe.zscore(keys.SESSION_EXPIRY, keys.session_member(owner.tenant, owner.name))
            gone = [o for o, expiry in zip(stale, pipe.execute(), strict=True) if expiry is None]
            if gone:
                log.warning("releasing the pins of %d session(s) that no longer exist", len(gone))
                tier_pins.release(self.kv_redis, k, gone)
                released += len(gone)
        return released
