"""check_integrity: do the cold tier's keys agree? (tests, admin: it reads every pack's size)."""

from __future__ import annotations

from collections import Counter
from typing import cast

from kvstore.redis import nodes
from kvstore.redis.client import KVClient
from kvstore.redis.keys import HASH_LEN, PinOwner, TierKeys


class TierIntegrityError(RuntimeError):
    """The cold tier's keys disagree: a bug (or someone wrote into the namespace), never user error."""


def check_integrity(client: KVClient, k: TierKeys, block_bytes: int) -> None:
    """Every pack has its LRU entry and metadata and the size the metadata says, the byte counter
    is their sum, every index entry names a pack holding that block. Pins balance: each block's pin
    count is the number of owners whose set holds it, each owner's bytes are its set's size times
    ``block_bytes``, each tenant's bytes the sum of its owners'; no other key is in the namespace."""
    problems = _packs(client, k)
    problems += _pins(client, k, block_bytes)
    known = {key.encode() for key in k.namespace()} | set(cast("dict[bytes, bytes]", client.hgetall(k.packs)))
    pinsets, owner_zsets = (k.prefix + "pinset:").encode(), (k.prefix + "owners:").encode()
    for key in nodes.scan_slot(client, k.pattern, k.index):
        if key not in known and not key.startswith((pinsets, owner_zsets)):
            problems.append(f"stray key {key!r}")
    for key in client.scan_iter(match=k.pack_pattern, count=1000):  # every shard's
        if key not in known:
            problems.append(f"stray pack {key!r}")
    if problems:
        raise TierIntegrityError("; ".join(problems))


def _packs(client: KVClient, k: TierKeys) -> list[str]:
    meta = cast("dict[bytes, bytes]", client.hgetall(k.packs))
    lru = set(cast("list[bytes]", client.zrange(k.lru, 0, -1)))
    problems = [f"lru {sorted(lru)} != packs {sorted(meta)}"] if lru != set(meta) else []
    members: dict[bytes, set[bytes]] = {}
    total = 0
    stored_sizes = nodes.run(client, [("STRLEN", key) for key in meta])  # packs on every shard
    for (pack_key, value), stored in zip(meta.items(), stored_sizes, strict=True):
        size, _, hashes = value.partition(b"|")
        members[pack_key] = {hashes[i : i + HASH_LEN] for i in range(0, len(hashes), HASH_LEN)}
        total += int(size)
        if stored != int(size):
            problems.append(f"{pack_key!r} holds {stored} bytes, its metadata says {int(size)}")
    if total != (counter := int(cast("bytes | None", client.get(k.bytes)) or 0)):
        problems.append(f"byte counter {counter} != sum of pack sizes {total}")
    for block_hash, where in cast("dict[bytes, bytes]", client.hgetall(k.index)).items():
        if block_hash not in members.get(where, ()):
            problems.append(f"index {block_hash.hex()} -> {where!r}, which does not hold it")
    return problems


def _pins(client: KVClient, k: TierKeys, block_bytes: int) -> list[str]:
    problems: list[str] = []
    expected_pins: Counter[bytes] = Counter()
    tenant_sum: Counter[str] = Counter()
    owner_bytes = {
        o.decode(): int(n) for o, n in cast("dict[bytes, bytes]", client.hgetall(k.owner_bytes)).items()
    }
    listed: set[str] = set()
    start = len(k.owners(""))
    for key in nodes.scan_slot(client, k.owners("*"), k.index):
        tenant = key[start:].decode()
        for raw in cast("list[bytes]", client.zrange(key, 0, -1)):
            owner = PinOwner.parse(raw.decode())
            listed.add(owner.id)
            if owner.tenant != tenant:
                problems.append(f"owner {owner.id!r} listed under tenant {tenant!r}")
            members = cast("set[bytes]", client.smembers(k.pinset(owner)))
            if not members:
                problems.append(f"owner {owner.id!r} is listed but pins nothing")
            expected_pins.update(members)
            if owner_bytes.get(owner.id, 0) != len(members) * block_bytes:
                problems.append(f"owner {owner.id!r}: {owner_bytes.get(owner.id)} bytes, {len(members)} pins")
            tenant_sum[tenant] += len(members) * block_bytes
    if set(owner_bytes) - listed:
        problems.append(f"owner bytes of unlisted owners {sorted(set(owner_bytes) - listed)}")
    for key in nodes.scan_slot(client, k.prefix + "pinset:*", k.index):
        if key.decode()[len(k.prefix + "pinset:") :] not in listed:
            problems.append(f"pin set {key!r} of no listed owner")
    pins = {h: int(n) for h, n in cast("dict[bytes, bytes]", client.hgetall(k.block_pins)).items()}
    if pins != dict(expected_pins):
        problems.append(f"block pins {len(pins)} entries != the owners' sets {len(expected_pins)}")
    tenants = {
        t.decode(): int(n) for t, n in cast("dict[bytes, bytes]", client.hgetall(k.tenant_bytes)).items()
    }
    if tenants != {t: n for t, n in tenant_sum.items() if n > 0}:
        problems.append(f"tenant bytes {tenants} != sum of their owners' {dict(tenant_sum)}")
    return problems
