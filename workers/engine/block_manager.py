"""BlockManager: maps sequences onto the block pool (block tables, prefix hits, hash commits)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvstore.chain import BlockHash, chain_root, hash_block, hash_blocks
from kvstore.pool.block import Block
from kvstore.pool.block_pool import BlockPool
from kvstore.tiers.stored_block import StoredBlock
from workers.engine.requests.sequence import EngineRequest
from workers.engine.tiers.kept_tails import KeptTails


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


MAX_CACHED_ROOTS = 4096


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


@dataclass(frozen=True, slots=True)
class BlockCopy:
    """A running sequence's partial block (src) that a new one starts with: copied into the new
    one's fresh block (dst) before the next forward, so the tokens they share are not computed
    again (copy on write: each then writes on into its own block)."""

    src: int
    dst: int


@dataclass(frozen=True, slots=True)
class BlockLoad:
    """A pool block allocated for a tier hit: `stored`'s bytes go into it before the forward."""

    block_id: int
    stored: StoredBlock


class BlockManager:
    """Bookkeeping only: it never touches tensors. Block ids are meaningful only in this pool."""

    def __init__(self, pool: BlockPool, model_fingerprint: str, max_kept_tails: int | None = None) -> None:
        self.pool = pool
        self.block_size = pool.block_size
        self.model_fingerprint = model_fingerprint
        self._roots: dict[str, BlockHash] = {}
        # Partial last blocks of finished session turns (requests named in tails.want()).
        self.tails = KeptTails(pool, pool.num_blocks // 8 if max_kept_tails is None else max_kept_tails)

    def root(self, cache_salt: str) -> BlockHash:
        """Parent of a sequence's first block: model weights and tenant salt, so no cross-tenant hit."""
        root = self._roots.get(cache_salt)
        if root is None:
            if len(self._roots) >= MAX_CACHED_ROOTS:  # clients choose salts: memoise a bounded few
                self._roots.clear()
            root = self._roots[cache_salt] = chain_root(self.model_fingerprint, cache_salt)
        return root

    def prefix_hashes(self, seq: EngineRequest) -> list[BlockHash]:
        """The hashes of all seq's full blocks but the one holding the last token (always computed:
        its logits pick the next token), memoised on seq: its tokens only grow at the end and a
        chained hash depends on its prefix alone, so only blocks new since are hashed."""
        bs = self.block_size
        num_blocks = (seq.num_tokens - 1) // bs
        known = seq.prefix_hashes
        if len(known) < num_blocks:
            parent = known[-1] if known else self.root(seq.cache_salt)
            tokens = seq.token_slice(len(known) * bs, num_blocks * bs)
            known = seq.prefix_hashes = known + hash_blocks(tokens, bs, (), parent=parent)
        return known[:num_blocks]

    def match_prefix(self, seq: EngineRequest) -> tuple[list[Block], list[BlockHash]]:
        """Cached full blocks covering seq's prefix, and prefix_hashes(seq). Reads the pool only:
        no reference taken, no LRU order or statistic changed."""
        if not self.pool.enable_caching:
            return [], []
        hashes = self.prefix_hashes(seq)
        if seq.needs_prompt_logits:  # its blocks are computed, and committed for others to hit
            return [], hashes
        hits = self.pool.match_prefix(hashes, seq.token_slice(0, len(hashes) * self.block_size))
        return hits, hashes

    def reused_tokens(
        self, seq: EngineRequest, hashes: list[BlockHash], known: int, donors: Sequence[EngineRequest]
    ) -> int:
        """Tokens after seq's `known` full blocks that allocate would give it uncomputed: a kept
        tail's, else a running donor's partial block's (a copy). Only looks."""
        if not self.pool.enable_caching or seq.needs_prompt_logits:
            return 0
        parent, bs = self._parent(seq, hashes, known), self.block_size
        reused = (
            self.tails.matched(parent, seq.token_slice(known * bs, seq.num_tokens - 1)) if self.tails else 0
        )
        fork = None if reused else self._donor(seq, hashes, known, donors)
        return fork[1] if fork else reused

    def allocate(
        self,
        seq: EngineRequest,
        hits: list[Block],
        hit_hashes: list[BlockHash],
        num_new: int,
        loaded: Sequence[StoredBlock] = (),
        donors: Sequence[EngineRequest] = (),
        copies: list[BlockCopy] | None = None,
    ) -> list[BlockLoad] | None:
        """Give a waiting seq its hit blocks, fresh blocks for the `loaded` ones and room for
        num_new tokens. Returns the loads (tier bytes the engine must write into those fresh blocks
        before the next forward); None (no change) if the pool is full. With no kept tail, a
        running sequence among `donors` whose partial block holds seq's next tokens gives them
        by a copy, appended to `copies` (n choices of one prompt compute its last block once)."""
        bs = self.block_size
        known = len(hits) + len(loaded)
        tail = self._take_tail(seq, hit_hashes, known)
        fork = None if tail or copies is None else self._donor(seq, hit_hashes, known, donors)
        reused = tail[1] if tail else fork[1] if fork else 0  # tokens this seq does not compute
        seq.num_tail_redis_tokens = reused if tail and tail[2] else 0
        cover = min(known * bs + reused + num_new, seq.num_tokens)  # the caller schedules past the tail
        need = cdiv(cover, bs) - len(hits) - (1 if tail else 0)
        revived = sum(1 for b in hits if b.ref_cnt == 0)  # cached-but-free hits leave the free queue
        self.tails.make_room(need + revived)
        if self.pool.num_free_blocks - revived < need:
            if tail:
                self.tails.keep(
                    self._parent(seq, hit_hashes, known),
                    tail[0],
                    tuple(seq.token_ids[known * bs : known * bs + reused]),
                )
            return None
        self.pool.touch(hits)
        new = self.pool.allocate(need)
        assert new is not None
        middle = [tail[0].block_id] if tail else []
        seq.block_ids = [
            *(b.block_id for b in hits),
            *(b.block_id for b in new[: len(loaded)]),
            *middle,
            *(b.block_id for b in new[len(loaded) :]),
        ]
        seq.block_hashes = list(hit_hashes[: len(hits)])
        loads: list[BlockLoad] = []
        for block, stored in zip(new, loaded, strict=False):
            parent = seq.block_hashes[-1] if seq.block_hashes else self.root(seq.cache_salt)
            self.pool.cache_full_block(block, parent, stored.block_hash, stored.token_ids)
            block.num_tokens = bs
            seq.block_hashes.append(stored.block_hash)
            loads.append(BlockLoad(block.block_id, stored))
        if fork is not None and copies is not None:  # the block after the known ones: the fork's
            target = self.pool.blocks[seq.block_ids[known]]
            target.num_tokens = reused
            copies.append(BlockCopy(fork[0], target.block_id))
        seq.num_computed_tokens = known * bs + reused
        return loads

    def _parent(self, seq: EngineRequest, hashes: list[BlockHash], index: int) -> BlockHash:
        return hashes[index - 1] if index else self.root(seq.cache_salt)

    def _take_tail(
        self, seq: EngineRequest, hashes: list[BlockHash], known: int
    ) -> tuple[Block, int, bool] | None:
        """A kept tail continuing the known blocks, whose tokens seq's next ones (bar the last,
        always computed) start with; seq owns it from here on."""
        if not self.pool.enable_caching or not self.tails or known > len(hashes) or seq.needs_prompt_logits:
            return None
        bs = self.block_size
        return self.tails.take(
            self._parent(seq, hashes, known), seq.token_ids[known * bs : seq.num_tokens - 1]
        )

    def _donor(
        self, seq: EngineRequest, hashes: list[BlockHash], known: int, donors: Sequence[EngineRequest]
    ) -> tuple[int, int] | None:
        """(block id, tokens): the running sequence's partial block at position `known`, after the
        same chain, whose computed tokens start seq's next ones (bar the last, always computed);
        the one that holds most of them."""
        bs = self.block_size
        want = seq.token_slice(known * bs, seq.num_tokens - 1)
        if not self.pool.enable_caching or not want or len(want) >= bs or seq.needs_prompt_logits:
            return None
        best: tuple[int, int] | None = None
        for other in donors:
            if other.cache_salt != seq.cache_salt or len(other.block_ids) <= known:
                continue
            same_chain = not known or other.block_hashes[known - 1 : known] == hashes[known - 1 : known]
            if len(other.block_hashes) < known or not same_chain:
                continue
            theirs = other.token_slice(known * bs, min(other.num_computed_tokens, known * bs + len(want)))
            reused = _common_prefix(want, theirs)
            if reused and (best is None or reused > best[1]):
                best = (other.block_ids[known], reused)
        return best

    def partial_tail(self, seq: EngineRequest) -> tuple[int, BlockHash, tuple[int, ...]] | None:
        """A session turn's partial last block (tails.want()): its index in seq.block_ids, the
        hash of the block before it (its parent) and its computed tokens; None when the turn's
        computed tokens end on a block boundary, or it is no session turn."""
        if not self.pool.enable_caching or not self.tails.wants(seq.request_id):
            return None
        bs = self.block_size
        full, reused = divmod(seq.num_computed_tokens, bs)
        if not reused or full != len(seq.block_hashes) or full >= len(seq.block_ids):
            return None
        parent = seq.block_hashes[-1] if full else self.root(seq.cache_salt)
        return full, parent, tuple(seq.token_ids[full * bs : full * bs + reused])

    def _keep_tail(self, seq: EngineRequest) -> int | None:
        """Index in seq.block_ids of the partial last block of a finished turn, now kept."""
        tail = self.partial_tail(seq) if seq.finish_reason in ("stop", "length") else None
        if tail is None:
            return None
        index, parent, tokens = tail
        kept = self.tails.keep(parent, self.pool.blocks[seq.block_ids[index]], tokens)
        return index if kept else None

    def blocks_to_append(self, seq: EngineRequest, num_new: int) -> int:
        return max(0, cdiv(seq.num_computed_tokens + num_new, self.block_size) - len(seq.block_ids))

    def can_append(self, seq: EngineRequest, num_new: int) -> bool:
        need = self.blocks_to_append(seq, num_new)
        self.tails.make_room(need)
        return self.pool.num_free_blocks >= need

    def append(self, seq: EngineRequest, num_new: int) -> None:
        need = self.blocks_to_append(seq, num_new)
        if need:
            new = self.pool.allocate(need)
            if new is None:
                raise RuntimeError("append without can_append")
            seq.block_ids.extend(b.block_id for b in new)

    def commit(self, seq: EngineRequest, prev_computed: int) -> None:
        """After a step computed tokens [prev_computed, seq.num_computed_tokens): fill counts, hashes."""
        bs = self.block_size
        for i in range(prev_computed // bs, cdiv(seq.num_computed_tokens, bs)):
            self.pool.blocks[seq.block_ids[i]].num_tokens = min(bs, seq.num_computed_tokens - i * bs)
        if not self.pool.enable_caching:
            return
        full = seq.num_computed_tokens // bs
        if full <= len(seq.block_hashes):
            return
        tokens = seq.token_ids
        for i in range(len(seq.block_hashes), full):
            parent = seq.block_hashes[-1] if seq.block_hashes else self.root(seq.cache_salt)
            block_tokens = tokens[i * bs : (i + 1) * bs]
            block_hash = hash_block(parent, block_tokens)
            self.pool.cache_full_block(self.pool.blocks[seq.block_ids[i]], parent, block_hash, block_tokens)
            seq.block_hashes.append(block_hash)

    def free(self, seq: EngineRequest) -> None:
        kept = self._keep_tail(seq) if self.pool.enable_caching else None
        if seq.finish_reason is not None:
            self.tails.forget(seq.request_id)
        self.pool.free([self.pool.blocks[b] for i, b in enumerate(seq.block_ids) if i != kept])
        seq.block_ids = []
        seq.block_hashes = []
