"""RedisTier: the cold tier, KV block packs in Redis shared by every worker of one model.

Content-addressed: a block is found by its hash, written once and never overwritten. Blocks travel
in packs (block_codec) of ``blocks_per_pack``, since values of a few MB move fastest. The index, LRU,
byte counter and pins change only in Lua scripts, atomic against the other workers: a plain
MULTI/EXEC cannot tell whether another worker wrote the same pack meanwhile, so its byte counter
would drift.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar, cast

import redis

from kvstore.block_codec import decode_pack, encode_pack
from kvstore.block_hash import BlockHash
from kvstore.stored_block import KVFormat, StoredBlock
from kvstore.tier_stats import RedisTierStats

T = TypeVar("T")
HASH_LEN = 32  # sha256 block hashes; the pack metadata concatenates them
_MAX_MGET_BYTES = 8 * 1024**2  # per MGET: one huge reply would hold Redis (and the job queue) longer
_UNSAFE_FINGERPRINT_CHARS = set("{}*?[]\\ \t\r\n")
_LOCAL_COUNTERS = (
    "blocks_written",
    "bytes_written",
    "blocks_read",
    "bytes_read",
    "read_hits",
    "read_misses",
    "packs_dropped",
    "packs_evicted",
)


@dataclass(frozen=True, slots=True)
class TierKeys:
    """Every Redis key of one model's cold tier; their formats are written here and nowhere else.

    The fingerprint sits in braces: a Redis Cluster hash tag, and no fingerprint's keys can match
    another's SCAN pattern (as "m:*" would match the keys of "m:x").
    """

    fingerprint: str

    def __post_init__(self) -> None:
        if not self.fingerprint or _UNSAFE_FINGERPRINT_CHARS & set(self.fingerprint):
            raise ValueError(f"model fingerprint {self.fingerprint!r} is empty or has braces, globs, spaces")

    @property
    def prefix(self) -> str:
        return f"kvferry:kv:{{{self.fingerprint}}}:"

    @property
    def pattern(self) -> str:
        """SCAN MATCH pattern of every key of this tier."""
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
    def pins(self) -> str:
        return self.prefix + "pins"  # HASH pack key -> pin count (> 0)

    def pack(self, member_hashes: Sequence[BlockHash]) -> str:
        """Named by its members, so two workers packing the same blocks alike write the same key."""
        digest = hashlib.blake2b(b"".join(member_hashes), digest_size=16).hexdigest()
        return f"{self.prefix}pack:{digest}"

    def namespace(self) -> list[str]:
        """KEYS[1..5] of every script."""
        return [self.index, self.lru, self.bytes, self.packs, self.pins]


_PRELUDE = f"""
local index, lru, bytes_key, packs, pins = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local HASH_LEN = {HASH_LEN}

local function drop(pack)
  local meta = redis.call('HGET', packs, pack)
  if meta then
    local sep = string.find(meta, '|', 1, true)
    for i = sep + 1, #meta, HASH_LEN do
      local h = string.sub(meta, i, i + HASH_LEN - 1)
      if redis.call('HGET', index, h) == pack then redis.call('HDEL', index, h) end
    end
    redis.call('DECRBY', bytes_key, tonumber(string.sub(meta, 1, sep - 1)))
  end
  redis.call('DEL', pack)
  redis.call('ZREM', lru, pack)
  redis.call('HDEL', packs, pack)
  redis.call('HDEL', pins, pack)
  return meta and 1 or 0
end

local function evict(capacity)
  local evicted, skip = 0, 0
  while tonumber(redis.call('GET', bytes_key) or '0') > capacity do
    local oldest = redis.call('ZRANGE', lru, skip, skip)
    if #oldest == 0 then break end
    if redis.call('HEXISTS', pins, oldest[1]) == 1 then
      skip = skip + 1
    else
      evicted = evicted + drop(oldest[1])
    end
  end
  return evicted
end
"""

# Runs in put's MULTI/EXEC right after a SET NX of each pack, so the bytes never pass through Lua
# (a script argument is copied twice: ~3x slower). Registers the packs nobody registered yet.
# KEYS[6..]: pack keys; ARGV[1]: capacity, then per pack: member hashes, lru score.
# Returns {blocks written, bytes written, packs evicted}.
_REGISTER = """
local written, written_bytes = 0, 0
for i = 6, #KEYS do
  local pack, members, score = KEYS[i], ARGV[2 * i - 10], ARGV[2 * i - 9]
  if redis.call('HEXISTS', packs, pack) == 0 then
    local size = redis.call('STRLEN', pack)
    for j = 1, #members, HASH_LEN do
      redis.call('HSET', index, string.sub(members, j, j + HASH_LEN - 1), pack)
    end
    redis.call('ZADD', lru, score, pack)
    redis.call('HSET', packs, pack, size .. '|' .. members)
    redis.call('INCRBY', bytes_key, size)
    written = written + #members / HASH_LEN
    written_bytes = written_bytes + size
  else
    -- another writer's identical pack: re-index members whose entry went with another pack
    for j = 1, #members, HASH_LEN do
      redis.call('HSETNX', index, string.sub(members, j, j + HASH_LEN - 1), pack)
    end
    redis.call('ZADD', lru, 'XX', score, pack)
  end
end
return {written, written_bytes, evict(tonumber(ARGV[1]))}
"""

# ARGV[1]: +1 or -1, ARGV[2]: capacity, ARGV[3..]: block hashes. Returns packs evicted.
_PIN = """
local delta = tonumber(ARGV[1])
for i = 3, #ARGV do
  local pack = redis.call('HGET', index, ARGV[i])
  if pack and redis.call('HINCRBY', pins, pack, delta) <= 0 then redis.call('HDEL', pins, pack) end
end
if delta < 0 then return evict(tonumber(ARGV[2])) end
return 0
"""

# KEYS[6..]: corrupt packs to drop; ARGV: (block hash, pack key) pairs of index entries naming a
# pack that was missing: its traces go unless it is back. Returns packs dropped.
_REPAIR = """
local dropped = 0
for i = 6, #KEYS do dropped = dropped + drop(KEYS[i]) end
for i = 1, #ARGV, 2 do
  local block_hash, pack = ARGV[i], ARGV[i + 1]
  if redis.call('EXISTS', pack) == 0 then
    drop(pack)
    if redis.call('HGET', index, block_hash) == pack then redis.call('HDEL', index, block_hash) end
  end
end
return dropped
"""


class TierIntegrityError(RuntimeError):
    """The cold tier's keys disagree: a bug (or someone wrote into the namespace), never user error."""


class RedisTier:
    def __init__(
        self,
        client: redis.Redis,
        fmt: KVFormat,
        capacity_bytes: int,
        blocks_per_pack: int | None = None,
        target_pack_bytes: int = 2 * 1024**2,
    ) -> None:
        if client.connection_pool.connection_kwargs.get("decode_responses"):
            raise ValueError("RedisTier needs a client with decode_responses=False: packs are binary")
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        if blocks_per_pack is None:
            blocks_per_pack = max(1, target_pack_bytes // fmt.nbytes)
        if blocks_per_pack < 1:
            raise ValueError(f"blocks_per_pack must be >= 1, got {blocks_per_pack}")
        self.client = client
        self.fmt = fmt
        self.capacity_bytes = capacity_bytes
        self.blocks_per_pack = blocks_per_pack
        self.keys = TierKeys(fmt.model_fingerprint)
        self._pin_script = client.register_script(_PRELUDE + _PIN)
        self._repair_script = client.register_script(_PRELUDE + _REPAIR)
        self._lock = threading.Lock()  # guards the counters: writer and task threads share a tier
        self._counts = dict.fromkeys(_LOCAL_COUNTERS, 0)

    def put(self, blocks: Sequence[StoredBlock]) -> int:
        """Write the blocks not yet indexed, consecutive ones packed together; returns blocks written.

        Then evicts least recently used unpinned packs until the stored bytes fit the capacity.
        """
        for block in blocks:  # all checked before anything is written
            sizes = (len(block.block_hash), len(block.token_ids), len(block.kv))
            if sizes != (HASH_LEN, self.fmt.block_size, self.fmt.nbytes):
                raise ValueError(f"block {block.block_hash.hex()}: hash, tokens, KV sizes {sizes}")
        unique = list({b.block_hash: b for b in blocks}.values())
        if not unique:
            return 0
        groups = self._new_packs(unique, self._locate([b.block_hash for b in unique]))
        if not groups:
            return 0
        now = time.time()
        pipe = self.client.pipeline(transaction=True)  # one MULTI/EXEC
        keys: list[str] = []
        args: list[bytes | float] = []
        for i, group in enumerate(groups):
            members = [b.block_hash for b in group]
            keys.append(self.keys.pack(members))
            pipe.set(keys[-1], encode_pack(self.fmt, group), nx=True)
            # A sequence's later packs count as used earlier: its tail is evicted before its prefix.
            args += [b"".join(members), now - i * 1e-6]
        namespace = [*self.keys.namespace(), *keys]
        pipe.eval(_PRELUDE + _REGISTER, len(namespace), *namespace, self.capacity_bytes, *args)
        written, written_bytes, evicted = (int(n) for n in pipe.execute()[-1])
        self._count(blocks_written=written, bytes_written=written_bytes, packs_evicted=evicted)
        return written

    def get_run(
        self, hashes: Sequence[BlockHash], token_ids: Sequence[Sequence[int]] | None = None
    ) -> list[StoredBlock]:
        """The valid blocks of hashes[0], hashes[1], ... up to the first one missing.

        A block whose tokens differ from ``token_ids[i]`` counts as missing. A corrupt or foreign
        pack ends the run and is deleted, so the next reader does not fetch it again.
        """
        if token_ids is not None and len(token_ids) != len(hashes):
            raise ValueError(f"{len(hashes)} hashes but {len(token_ids)} token lists")
        if not hashes:
            return []
        lead = _leading(self._locate(hashes))
        values = self._fetch(list(dict.fromkeys(lead)))
        opened: dict[bytes, dict[BlockHash, StoredBlock]] = {}  # pack key -> its valid blocks
        corrupt: list[bytes] = []
        missing: list[bytes] = []  # (hash, pack key): an index entry naming a pack that is gone
        used: list[bytes] = []  # packs the run came from, in order
        run: list[StoredBlock] = []
        blocks_read = 0
        for i, pack_key in enumerate(lead):
            data = values[pack_key]
            if data is None:  # evicted since the index was read (or an entry left behind)
                missing += [hashes[i], pack_key]
                break
            if pack_key not in opened:
                decoded = decode_pack(self.fmt, data)
                blocks_read += len(decoded.blocks) + decoded.dropped
                opened[pack_key] = {b.block_hash: b for b in decoded.blocks}
                if decoded.reason is not None:  # its valid blocks still serve this read
                    corrupt.append(pack_key)
            block = opened[pack_key].get(hashes[i])
            if block is None:  # dropped by the codec, or never in the pack its index names
                if pack_key not in corrupt:
                    corrupt.append(pack_key)
                break
            if token_ids is not None and tuple(token_ids[i]) != block.token_ids:
                break
            run.append(block)
            if not used or used[-1] != pack_key:
                used.append(pack_key)
        if used:
            now = time.time()
            self.client.zadd(self.keys.lru, {key: now - j * 1e-6 for j, key in enumerate(used)}, xx=True)
        if corrupt or missing:
            self._repair_script(keys=[*self.keys.namespace(), *corrupt], args=missing)
        self._count(
            blocks_read=blocks_read,
            bytes_read=sum(len(v) for v in values.values() if v is not None),
            read_hits=len(run),
            read_misses=len(hashes) - len(run),
            packs_dropped=len(corrupt),
        )
        return run

    def contains_run(self, hashes: Sequence[BlockHash]) -> int:
        """How many of hashes[0], hashes[1], ... the index holds, up to the first it does not."""
        if not hashes:
            return 0
        return len(_leading(self._locate(hashes)))

    def pin(self, hashes: Sequence[BlockHash]) -> None:
        """One more pin on the pack of each indexed block (counted per block): never evicted while
        pinned. Blocks not in Redis are ignored."""
        if hashes:
            self._pin_script(keys=self.keys.namespace(), args=[1, self.capacity_bytes, *hashes])

    def unpin(self, hashes: Sequence[BlockHash]) -> None:
        """Undo ``pin(hashes)``, then evict to the capacity, as the packs may be evictable now."""
        if hashes:
            evicted = self._pin_script(keys=self.keys.namespace(), args=[-1, self.capacity_bytes, *hashes])
            self._count(packs_evicted=int(evicted))

    def stats(self) -> RedisTierStats:
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.keys.bytes)
        pipe.zcard(self.keys.lru)
        stored, packs = pipe.execute()
        with self._lock:
            counts = dict(self._counts)
        return RedisTierStats(
            bytes_stored=int(stored or 0), packs=int(packs), capacity_bytes=self.capacity_bytes, **counts
        )

    def clear(self) -> None:
        """Delete every key of this model's tier (tests, admin); other models' keys stay."""
        for batch in _batched(list(self.client.scan_iter(match=self.keys.pattern, count=1000)), 500):
            self.client.delete(*batch)

    def check_integrity(self) -> None:
        """Raise TierIntegrityError if the keys disagree (tests, admin: it reads every pack's size).

        Every pack has its LRU entry and metadata and the size the metadata says, the byte counter
        is their sum, every index entry names a pack holding that block, every pin a live pack.
        """
        k = self.keys
        meta = cast("dict[bytes, bytes]", self.client.hgetall(k.packs))
        lru = set(cast("list[bytes]", self.client.zrange(k.lru, 0, -1)))
        problems = [f"lru {sorted(lru)} != packs {sorted(meta)}"] if lru != set(meta) else []
        members: dict[bytes, set[bytes]] = {}
        total = 0
        for pack_key, value in meta.items():
            size, _, hashes = value.partition(b"|")
            members[pack_key] = {hashes[i : i + HASH_LEN] for i in range(0, len(hashes), HASH_LEN)}
            total += int(size)
            if (stored := self.client.strlen(pack_key)) != int(size):
                problems.append(f"{pack_key!r} holds {stored} bytes, its metadata says {int(size)}")
        if total != (counter := int(cast("bytes | None", self.client.get(k.bytes)) or 0)):
            problems.append(f"byte counter {counter} != sum of pack sizes {total}")
        for block_hash, where in cast("dict[bytes, bytes]", self.client.hgetall(k.index)).items():
            if block_hash not in members.get(where, ()):
                problems.append(f"index {block_hash.hex()} -> {where!r}, which does not hold it")
        for pack_key, count in cast("dict[bytes, bytes]", self.client.hgetall(k.pins)).items():
            if pack_key not in meta or int(count) <= 0:
                problems.append(f"pin {pack_key!r} = {count!r}")
        known = {key.encode() for key in (k.index, k.lru, k.bytes, k.packs, k.pins)} | set(meta)
        for key in self.client.scan_iter(match=k.pattern, count=1000):
            if key not in known:
                problems.append(f"stray key {key!r}")
        if problems:
            raise TierIntegrityError("; ".join(problems))

    def _new_packs(self, blocks: list[StoredBlock], indexed: list[bytes | None]) -> list[list[StoredBlock]]:
        """The blocks not indexed yet, in runs cut at indexed ones and at blocks_per_pack."""
        groups: list[list[StoredBlock]] = []
        extend = False
        for block, pack_key in zip(blocks, indexed, strict=True):
            if pack_key is not None:
                extend = False
            elif extend and len(groups[-1]) < self.blocks_per_pack:
                groups[-1].append(block)
            else:
                groups.append([block])
                extend = True
        return groups

    def _locate(self, hashes: Sequence[BlockHash]) -> list[bytes | None]:
        """The pack key of each block, None where the index has none (one round trip)."""
        return cast("list[bytes | None]", self.client.hmget(self.keys.index, list(hashes)))

    def _fetch(self, pack_keys: list[bytes]) -> dict[bytes, bytes | None]:
        """Every pack in one round trip, split into MGETs of a few MB so none holds Redis long."""
        if not pack_keys:
            return {}
        per_call = max(1, _MAX_MGET_BYTES // (self.blocks_per_pack * self.fmt.nbytes))
        pipe = self.client.pipeline(transaction=False)
        for chunk in _batched(pack_keys, per_call):
            pipe.mget(chunk)
        values = list(itertools.chain.from_iterable(pipe.execute()))
        return dict(zip(pack_keys, values, strict=True))

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._counts[name] += delta


def _leading(located: list[bytes | None]) -> list[bytes]:
    """The pack keys up to the first block the index does not hold."""
    lead = []
    for pack_key in located:
        if pack_key is None:
            break
        lead.append(pack_key)
    return lead


def _batched(items: Sequence[T], n: int) -> list[Sequence[T]]:
    return [items[i : i + n] for i in range(0, len(items), n)]
