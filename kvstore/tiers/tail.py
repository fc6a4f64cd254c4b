"""Tail: a session turn's partial last block as the tiers carry it, so a turn moved to another
worker computes only its new tokens, as the worker that kept the conversation does.

Only full blocks are hashed and shared; a finished turn's last, partial block (its last 1 to
block_size - 1 computed tokens) stays in its worker's pool as a kept tail
(workers/engine/tiers/kept_tails.py). It is also written through to the Redis tier with the turn's
blocks, as one stored block: its key is tail_hash(parent, tokens) (a domain of its own: no full
block's chain hash can equal it), its token ids the tail's, padded to block_size with PAD, its
bytes the whole block's (only the first len(tokens) slots mean anything). A worker the session
moves to looks it up under the last full block it holds, for each length its prompt allows
(kvstore/redis/tails.py), and keeps it as if it had computed it."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvstore.chain import BlockHash

if TYPE_CHECKING:  # torch's: the simulated worker's prefetch path imports this module
    from kvstore.layout import KVBytes
    from kvstore.tiers.stored_block import StoredBlock

_TAIL_TAG = b"kvferry/tail/v1"
PAD = 0  # the stored token ids after a tail's own (never read: the key names the tail's length)


def tail_hash(parent: BlockHash, tokens: Sequence[int]) -> BlockHash:
    """sha256(tag || parent || token count || tokens as little-endian int64)."""
    h = hashlib.sha256(_TAIL_TAG)
    h.update(parent)
    h.update(struct.pack(f"<Q{len(tokens)}q", len(tokens), *tokens))
    return h.digest()


def padded(tokens: Sequence[int], block_size: int) -> tuple[int, ...]:
    return (*tokens, *[PAD] * (block_size - len(tokens)))


@dataclass(frozen=True, slots=True)
class Tail:
    parent: BlockHash  # the chain hash of the full block before it (or the chain's root)
    tokens: tuple[int, ...]  # its computed tokens: 1 to block_size - 1
    kv: KVBytes  # the whole block's bytes, as the pool holds it

    @property
    def block_hash(self) -> BlockHash:
        return tail_hash(self.parent, self.tokens)

    @classmethod
    def of(cls, stored: StoredBlock, length: int) -> Tail:
        """The tail a stored block found under tail_hash(parent, its first `length` tokens) holds."""
        return cls(stored.parent_hash, stored.token_ids[:length], stored.kv)


def candidates(parent: BlockHash, following: Sequence[int], block_size: int) -> list[tuple[BlockHash, int]]:
    """(tail hash, length) for each tail under `parent` that `following` (the prompt's tokens after
    it, its last one excluded: always computed) could start with, shortest first."""
    most = min(block_size - 1, len(following))
    return [(tail_hash(parent, following[:k]), k) for k in range(1, most + 1)]
