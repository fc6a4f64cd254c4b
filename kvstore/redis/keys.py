"""TierKeys: every Redis key of one model's cold tier, and who may hold pins on its blocks.

Kept free of torch and numpy (only hashlib): the API imports it to release a deleted session's pins.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from kvstore.chain import BlockHash

HASH_LEN = 32  # sha256 block hashes; the pack metadata concatenates them
TIER_REGISTRY = "kvferry:kv:tiers"  # SET of the fingerprints that have a tier in this Redis
PACK_PREFIX = "kvferry:kv:pack:"  # every tier's packs: PACK_PREFIX + "{digest}:{fingerprint}"
PACK_TTL_S = 30 * 86400  # what makes packs (and only packs) evictable under volatile-lru
# Why a read was made, each with its own bytes counter (bytes_read_<cause>, beside bytes_read): a
# job's prefetch of its prompt, a routing hint's ahead of a moved turn, a session turn's partial last
# block, a new worker's warm start.
READ_CAUSES = ("job", "hint", "tail", "warm_start")
_UNSAFE_FINGERPRINT_CHARS = set("{}*?[]\\ \t\r\n")

OwnerKind = Literal["s", "p"]  # a session's pins, or a tenant's preloaded templates


@dataclass(frozen=True, slots=True)
class PinOwner:
    """Whoever holds pins: a tenant's session, or its preloaded prompts. The id is length-prefixed,
    so no tenant or session id, whatever characters it has, can be mistaken for another's."""

    kind: OwnerKind
    tenant: str
    name: str  # the session id ("" for preload)

    @property
    def id(self) -> str:
        return f"{self.kind}:{len(self.tenant)}:{self.tenant}:{self.name}"

    @classmethod
    def session(cls, tenant: str, session_id: str) -> PinOwner:
        return cls("s", tenant, session_id)

    @classmethod
    def preload(cls, tenant: str) -> PinOwner:
        return cls("p", tenant, "")

    @classmethod
    def parse(cls, owner_id: str) -> PinOwner:
        kind, _, rest = owner_id.partition(":")
        length, _, rest = rest.partition(":")
        if kind not in ("s", "p") or not length.isdigit() or rest[int(length) : int(length) + 1] != ":":
            raise ValueError(f"not a pin owner id: {owner_id!r}")
        n = int(length)
        return cls("s" if kind == "s" else "p", rest[:n], rest[n + 1 :])


@dataclass(frozen=True, slots=True)
class TierKeys:
    """Every Redis key of one model's cold tier; their formats are written here and nowhere else
    (the Lua scripts build pinset/owners keys from ``prefix`` the same way).

    The fingerprint sits in braces: a Redis Cluster hash tag, so the tier's metadata (index, LRU,
    byte counter, pins, owners, quota; the keys its Lua scripts change together) shares one slot,
    and no fingerprint's keys can match another's SCAN pattern (as "m:*" would match "m:x"'s).
    Packs are the exception (``pack``): each in a slot of its own.
    """

    fingerprint: str  # the tier's id: the model fingerprint, plus ":<tier dtype>" for a lossy tier

    def __post_init__(self) -> None:
        if not self.fingerprint or _UNSAFE_FINGERPRINT_CHARS & set(self.fingerprint):
            raise ValueError(f"model fingerprint {self.fingerprint!r} is empty or has braces, globs, spaces")

    @classmethod
    def for_tier(cls, model_fingerprint: str, tier_dtype: str = "exact") -> TierKeys:
        """The keys of one model's tier in one stored dtype. A lossy tier (int8, fp16, bf16) is a
        namespace of its own, so an exact worker never reads its packs, nor it an exact one's; it
        is registered (TIER_REGISTRY) under its own id, so pin releases and reports reach it too."""
        return cls(model_fingerprint if tier_dtype == "exact" else f"{model_fingerprint}:{tier_dtype}")

    @property
    def prefix(self) -> str:
        return f"kvferry:kv:{{{self.fingerprint}}}:"

    @property
    def pattern(self) -> str:
        """SCAN MATCH pattern of every key of this tier but its packs (``pack_pattern``)."""
        return self.prefix + "*"

    @property
    def index(self) -> str:
        return self.prefix + "index"  # HASH block hash (bin) -> pack key

    @property
    def lru(self) -> str:
        return self.prefix + "lru"  # ZSET pack key -> last use (unix seconds)

    @property
    def bytes(self) -> str:
        return self.prefix + "bytes"  # STRING: bytes of every pack

    @property
    def packs(self) -> str:
        return self.prefix + "packs"  # HASH pack key -> b"<size>|" + its block hashes concatenated

    @property
    def block_pins(self) -> str:
        return self.prefix + "blockpins"  # HASH block hash -> how many owners pin it (> 0)

    @property
    def tenant_bytes(self) -> str:
        return self.prefix + "tenantbytes"  # HASH tenant -> bytes its owners pin (> 0)

    @property
    def owner_bytes(self) -> str:
        return self.prefix + "ownerbytes"  # HASH owner id -> bytes it pins (> 0)

    @property
    def counters(self) -> str:
        return self.prefix + "counters"  # HASH hits, misses, bytes_read, bytes_written, ... (all processes)

    def pinset(self, owner: PinOwner) -> str:
        return self.prefix + "pinset:" + owner.id  # SET of the block hashes the owner pins

    def owners(self, tenant: str) -> str:
        return self.prefix + "owners:" + tenant  # ZSET owner id -> last pin (the tenant's pin LRU)

    def pack(self, member_hashes: Sequence[BlockHash]) -> str:
        """Named by its members, so two workers packing the same blocks alike write the same key.

        Its hash tag is its digest, not the fingerprint: on a Redis Cluster the packs (the bytes)
        spread over every shard while the tier's metadata stays in the fingerprint's slot. It is
        outside ``prefix``: ``pack_pattern`` finds a tier's packs. (Packs written before this
        layout are named ``prefix + "pack:" + digest``; the index stores each pack's key, so they
        still read.)"""
        digest = hashlib.blake2b(b"".join(member_hashes), digest_size=16).hexdigest()
        return f"{PACK_PREFIX}{{{digest}}}:{{{self.fingerprint}}}"

    @property
    def pack_pattern(self) -> str:
        """SCAN MATCH pattern of this tier's packs (no fingerprint holds a brace, so no other's match)."""
        return f"{PACK_PREFIX}*:{{{self.fingerprint}}}"

    def namespace(self) -> list[str]:
        """KEYS[1..NAMESPACE_KEYS] of every script, in the order lua/prelude.lua names them."""
        return [
            self.index,
            self.lru,
            self.bytes,
            self.packs,
            self.block_pins,
            self.tenant_bytes,
            self.owner_bytes,
            self.counters,
        ]


NAMESPACE_KEYS = 8
