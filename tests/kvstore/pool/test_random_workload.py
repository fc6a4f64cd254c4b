"""A seeded random workload against a reference model of refcounts: no leaks, no drift."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import pytest

from kvstore.chain import BlockHash, hash_block, hash_blocks, root_hash
from kvstore.pool.block import Block
from kvstore.pool.block_pool import BlockPool
from kvstore.pool.events import BlockEvent, BlockRemoved, BlockStored
from tests.kvstore._helpers import EXTRA_KEYS

BS = 4
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 7, 7, 7, 7], [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 1, 2]]


@dataclass
class Seq:
    tokens: list[int]
    blocks: list[Block]
    hashes: list[BlockHash] = field(default_factory=list)


def start(pool: BlockPool, rng: random.Random) -> Seq | None:
    tokens = [*rng.choice(PROMPTS), *(rng.randrange(12) for _ in range(rng.randrange(6)))]
    hashes = hash_blocks(tokens, BS, EXTRA_KEYS)
    hits = pool.match_prefix(hashes, tokens)
    pool.record_prefix_query(len(tokens), len(hits) * BS)
    pool.touch(hits)
    new = pool.allocate(-(-len(tokens) // BS) - len(hits))
    if new is None:
        pool.free(hits)
        return None
    seq = Seq(tokens, [*hits, *new], hashes[: len(hits)])
    for i in range(len(hits), len(seq.blocks)):
        chunk = tokens[i * BS : (i + 1) * BS]
        seq.blocks[i].num_tokens = len(chunk)
        if len(chunk) == BS:
            commit_next(pool, seq, chunk)
    return seq


def commit_next(pool: BlockPool, seq: Seq, chunk: list[int]) -> None:
    parent = seq.hashes[-1] if seq.hashes else root_hash(EXTRA_KEYS)
    block_hash = hash_block(parent, chunk)
    pool.cache_full_block(seq.blocks[len(seq.hashes)], parent, block_hash, chunk)
    seq.hashes.append(block_hash)


def extend(pool: BlockPool, seq: Seq, rng: random.Random) -> None:
    for _ in range(rng.randrange(1, 7)):
        if len(seq.tokens) % BS == 0:
            more = pool.allocate(1)
            if more is None:
                return
            seq.blocks += more
        seq.tokens.append(rng.randrange(12))
        seq.blocks[-1].num_tokens += 1
        if len(seq.tokens) % BS == 0:
            commit_next(pool, seq, seq.tokens[-BS:])


def check(pool: BlockPool, live: list[Seq], indexed: set[BlockHash]) -> None:
    pool.check_integrity()
    refs = Counter(b.block_id for s in live for b in s.blocks)
    assert [b.ref_cnt for b in pool.blocks] == [refs[i] for i in range(pool.num_blocks)]
    assert {b.block_hash for b in pool.blocks if b.block_hash is not None} >= indexed
    for s in live:
        assert len(s.blocks) == -(-len(s.tokens) // BS)
        assert s.hashes == hash_blocks(s.tokens, BS, EXTRA_KEYS)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_workload_has_no_leaks(seed: int) -> None:
    rng = random.Random(seed)
    pool = BlockPool(num_blocks=12, block_size=BS)
    indexed: set[BlockHash] = set()

    def track(event: BlockEvent) -> None:
        if isinstance(event, BlockStored):
            assert event.block_hash not in indexed
            indexed.add(event.block_hash)
        elif isinstance(event, BlockRemoved):
            indexed.remove(event.block_hash)
        else:
            indexed.clear()

    pool.subscribe(track)
    live: list[Seq] = []
    for _ in range(400):
        op = rng.random()
        if op < 0.4 or (not live and op < 0.95):
            seq = start(pool, rng)
            if seq is not None:
                live.append(seq)
        elif op < 0.7 and live:
            extend(pool, rng.choice(live), rng)
        elif op < 0.98 and live:
            pool.free(live.pop(rng.randrange(len(live))).blocks)
        else:
            assert pool.reset_prefix_cache() is (not live)
        check(pool, live, indexed)
    assert pool.stats().prefix_cache_hits_tokens > 0  # the workload did share prefixes
    for seq in live:
        pool.free(seq.blocks)
        pool.check_integrity()
    stats = pool.stats()
    assert stats.blocks_used == 0 and pool.num_free_blocks == pool.num_blocks
    assert stats.blocks_cached >= len(indexed)
    check(pool, [], indexed)
